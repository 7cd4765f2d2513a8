"""``idemp worker --reload``: a changed listener module restarts the worker gracefully
(the old one commits what it handled, the new one goes on from there), a broken edit
waits for the next, and SIGTERM stops both processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from idemp.broker.process import BrokerProcess
from idemp.client import OutMessage, Producer
from tests.client.conftest import wait_for
from tests.realbroker import broker_of

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

SERVICE = """
import sys
from idemp import App, Message
from idemp.client import ConsumeFrom

app = App("reloading")


@app.listener("Reloads", group="reloads", key="keys", consume_from=ConsumeFrom.FIRST_OFFSET)
def on_message(message: Message) -> None:
    sys.stdout.write("VERSION " + message.keys[0] + "\\n")
    sys.stdout.flush()
"""


def _send(broker: BrokerProcess, key: str) -> None:
    with Producer(broker.namesrv_addr, "reload-producer") as producer:
        producer.send(OutMessage("Reloads", b"{}", keys=[key]))


def _reloader(broker: BrokerProcess, tmp_path: Path, *options: str) -> subprocess.Popen[bytes]:
    """``idemp worker service:app --reload`` in ``tmp_path/svc``, its output in
    ``tmp_path/worker.out`` and ``worker.err``."""
    env = dict(
        os.environ,
        IDEMP_NAMESRV=broker.namesrv_addr,
        IDEMP_BACKEND=f"sqlite:///{tmp_path / 'dedup.db'}",
        PYTHONPATH=str(ROOT),
    )
    cmd = [sys.executable, "-m", "idemp", "worker", "service:app", "--reload", *options]
    with open(tmp_path / "worker.out", "w") as out, open(tmp_path / "worker.err", "w") as err:
        return subprocess.Popen(cmd, cwd=tmp_path / "svc", env=env, stdout=out, stderr=err)


def test_a_changed_module_restarts_the_worker(tmp_path: Path) -> None:
    app_dir = tmp_path / "svc"
    app_dir.mkdir()
    module = app_dir / "service.py"
    module.write_text(SERVICE.replace("VERSION", "v1"))
    ready = tmp_path / "ready.json"
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with broker_of(tmp_path / "store", None, HERE) as broker:
        _send(broker, "k1")  # the topic exists before the worker starts
        proc = _reloader(broker, tmp_path, "--ready-file", str(ready), "--shutdown-timeout", "10")
        try:

            def pid() -> int | None:
                text = ready.read_text() if ready.exists() else ""
                return json.loads(text)["pid"] if text else None

            first = wait_for(pid, 60, "the first worker")  # (handling may come first)
            assert first != proc.pid  # the worker is a child of the reloader
            wait_for(lambda: "v1 k1" in out.read_text(), 60, "v1 to handle k1")

            module.write_text(SERVICE.replace("VERSION", "v2"))
            second = wait_for(lambda: pid() not in (None, first) and pid(), 60, "a new worker")
            _send(broker, "k2")
            wait_for(lambda: "v2 k2" in out.read_text(), 60, "v2 to handle k2")
            # the old worker committed k1 before it stopped: the new one did not see it
            assert out.read_text().splitlines() == ["v1 k1", "v2 k2"]

            module.write_text("def broken(:\n")  # the new worker fails to start...
            wait_for(lambda: "exited with code 2" in err.read_text(), 60, "the broken module")
            module.write_text(SERVICE.replace("VERSION", "v3"))  # ...and the next edit runs
            third = wait_for(
                lambda: pid() not in (None, first, second) and pid(), 60, "a third worker"
            )
            _send(broker, "k3")
            wait_for(lambda: "v3 k3" in out.read_text(), 60, "v3 to handle k3")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        log = err.read_text()
        assert code == 0, log
        assert out.read_text().splitlines() == ["v1 k1", "v2 k2", "v3 k3"]
        assert log.count("event=reload changed=") == 3
        # each worker stopped as SIGTERM stops one: handlers done, offsets committed
        assert log.count("event=stopped app=reloading") == 3, log
        try:
            os.kill(third, 0)
        except ProcessLookupError:
            pass  # the last worker is gone with the reloader
        else:
            raise AssertionError(f"worker {third} outlived the reloader")


def test_reload_without_watchfiles_says_how_to_get_it(tmp_path: Path) -> None:
    # a module named watchfiles that cannot be imported stands for a missing install
    (tmp_path / "watchfiles.py").write_text("raise ImportError('no watchfiles here')\n")
    done = subprocess.run(
        [sys.executable, "-m", "idemp", "worker", "service:app", "--reload"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "idemp worker: --reload needs watchfiles: pip install 'idemp[reload]'"
    )


def test_the_child_gets_every_option_but_reload() -> None:
    """Every worker option given to the reloader reaches its child: the child's command
    line, parsed by the worker's own parser, gives back the same options."""
    import argparse

    from idemp import worker
    from idemp.reload import child_command

    parser = argparse.ArgumentParser()
    worker.add_arguments(parser)
    given = ["svc:app", "--namesrv", "n:1", "--endpoint", "e:2", "--http-port", "0"]
    given += ["--http-host", "0.0.0.0", "--shutdown-timeout", "7.5", "--log-format", "json"]
    given += ["--log-level", "DEBUG", "--ready-file", "r.json", "--reload", "--reload-dir", "d"]
    args = parser.parse_args(given)
    every = {a.dest for a in parser._actions if a.dest != "help"}
    assert every == set(vars(args))  # each option of the parser is given above
    cmd = child_command(args)
    assert cmd[:4] == [sys.executable, "-m", "idemp", "worker"]
    back = vars(parser.parse_args(cmd[4:]))
    want = vars(args) | {"reload": False, "reload_dir": None}
    assert back == want


SLOW = """
import sys, time
from idemp import App, Message
from idemp.client import ConsumeFrom

app = App("reloading")


@app.listener("Reloads", group="reloads", key="keys", consume_from=ConsumeFrom.FIRST_OFFSET)
def on_message(message: Message) -> None:
    sys.stdout.write("started\\n")
    sys.stdout.flush()
    time.sleep(120)  # still running when the signals come
"""


def test_a_second_signal_reaches_the_worker(tmp_path: Path) -> None:
    """Ctrl-C twice: the first stops the worker gracefully (it waits for the handler),
    the second is passed on, and the worker exits at once (code 1, as without --reload)."""
    app_dir = tmp_path / "svc"
    app_dir.mkdir()
    (app_dir / "service.py").write_text(SLOW)
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with broker_of(tmp_path / "store", None, HERE) as broker:
        _send(broker, "k1")
        proc = _reloader(broker, tmp_path, "--shutdown-timeout", "120")
        try:
            wait_for(lambda: "started" in out.read_text(), 60, "the slow handler")
            proc.send_signal(signal.SIGINT)
            wait_for(lambda: "event=stopping signal=SIGTERM\n" in err.read_text(), 30, "stop")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(30)  # not the 120 s the handler would take
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert code == 1, err.read_text()
    assert "second signal, exiting now" in err.read_text()
