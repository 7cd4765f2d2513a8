"""Every script in examples/ runs (in a subprocess, as a user would run it) and prints
its exact result."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.realbroker import broker_of, real_home
from tests.servers import PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parents[2]

# script → the line it prints when every effect happened exactly once
EXPECTED = {
    "payment_deduction": "charges 20, balance 75000 cents (expected 75000); processed 20, "
    "duplicates 4, failures 1",
    "loyalty_points": "t_points rows 25 for 25 orders, 1050 points; processed 25, "
    "duplicates absorbed 7",
    "ride_hailing_states": "applied 60 transitions, every order in the machine's order: True; "
    "final states ['arrived']; held ",
    "redis_flag_72h": "issued 15 coupons for 15 keys (duplicates absorbed 2); flag "
    "example:{coupons/CouponIssued:c-4} expires in 72.00 h",
    "optimistic_version": "orders [('delivered', 4)]; updates 24, stale dropped 8, ",
    "pessimistic_row_lock": "30 orders reserved once each, stock left 70 (expected 70); "
    "handler runs 36, ",
    "redisson_lock": "texts sent 12 to 12 phones for 12 rides (36 deliveries); ",
    "orderly_sharding": "12 orders x 5 steps, each order's steps in send order: True; "
    "duplicates absorbed 8",
    # 4 producer retries, plus whatever the wheel redelivers (it sends back a whole pull
    # batch on one RECONSUME_LATER): every one absorbed, the count is not fixed.
    "service": "orders 30, each once: True; ride steps 20, each ride in order: True",
    "official_push_consumer": "effects 10 for 10 orders; every producer retry absorbed: True",
    "request_reply": "quotes 5 answered, each by its own reply: True; "
    "fares [370, 490, 610, 730, 850]; recorded 5",
}
NEEDS = {"redis_flag_72h": "redis", "redisson_lock": "redis", "pessimistic_row_lock": "pg"}


def test_every_example_is_tested() -> None:
    scripts = {p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.official) if n.startswith("official") else n
        for n in EXPECTED
    ],
)
def test_example(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    env.pop("DATABASE_URL", None)
    env.pop("NAMESRV_ADDR", None)
    with ExitStack() as stack:
        if real_home():  # IDEMP_4X_REAL: the example against RocketMQ 4.9.7 (NAMESRV_ADDR)
            props = {"messageDelayLevel": " ".join(["1s"] * 18)}  # as the embedded broker's
            real = stack.enter_context(broker_of(tmp_path / "store", props, Path(__file__)))
            env["NAMESRV_ADDR"] = real.namesrv_addr
        _run_example(name, request, tmp_path, env)


def _run_example(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, env: dict[str, str]
) -> None:
    need = NEEDS.get(name)
    if need == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        env["REDIS_URL"] = redis.url
    elif need == "pg":
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        env["DATABASE_URL"] = pg.url
    if name == "redis_flag_72h" or name == "redisson_lock":
        import redis as redis_py

        client = redis_py.Redis.from_url(env["REDIS_URL"])
        for key in client.scan_iter("example:*"):  # a rerun in the same session
            client.delete(key)
        client.close()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(EXPECTED[name]), proc.stdout
