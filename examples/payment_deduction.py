"""Payment deduction: a unique-key table in transactional mode.

Each ``PaymentRequested`` event deducts an amount from an account. The dedup row and the
business writes (the charge row, the new balance) commit in ONE transaction, so a crash
between them is impossible: either both exist or neither. Injected here: producer
retries (same payment id, new msgId) and a handler that fails on its first try (the
transaction rolls back, the message comes back, the charge happens once).

    python examples/payment_deduction.py
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

import sqlalchemy as sa
from _embedded import broker, producer, send, settings, wait_until

from idemp import Context, Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import UniqueKeyTable

TOPIC, GROUP = "PaymentRequested", "payments"
PAYMENTS = 20
meta = sa.MetaData()
accounts = sa.Table(
    "t_account",
    meta,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("balance_cents", sa.Integer, nullable=False),
)
charges = sa.Table(
    "t_charge",
    meta,
    sa.Column("payment_id", sa.String(64), primary_key=True),
    sa.Column("account_id", sa.String(32)),
    sa.Column("amount_cents", sa.Integer),
)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, broker() as namesrv:
        url = f"sqlite:///{Path(tmp) / 'payments.db'}"
        engine = sa.create_engine(url)
        meta.create_all(engine)
        with engine.begin() as conn:
            conn.execute(accounts.insert().values(id="alice", balance_cents=100_000))
        strategy = UniqueKeyTable(url, transactional=True)
        failed_once: set[str] = set()
        lock = threading.Lock()

        @idempotent(key="json:$.payment_id", strategy=strategy, name="payments")
        def deduct(message: Message, ctx: Context) -> None:
            p = message.json()
            conn = ctx.connection  # the dedup row commits in this same transaction
            conn.execute(
                sa.update(accounts)
                .where(accounts.c.id == p["account"])
                .values(balance_cents=accounts.c.balance_cents - p["amount_cents"])
            )
            conn.execute(
                charges.insert().values(
                    payment_id=p["payment_id"],
                    account_id=p["account"],
                    amount_cents=p["amount_cents"],
                )
            )
            with lock:
                if p["payment_id"] == "pay-7" and "pay-7" not in failed_once:
                    failed_once.add("pay-7")  # after the writes: they roll back
                    raise ConnectionError("card processor timed out")

        def charged() -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(sa.select(sa.func.count()).select_from(charges)).scalar_one()
                )

        p = producer(namesrv)
        for i in range(PAYMENTS):
            body = json.dumps({"payment_id": f"pay-{i}", "account": "alice", "amount_cents": 1250})
            send(p, TOPIC, body, f"pay-{i}")
            if i % 5 == 0:  # the ack was lost: the producer sends it again (new msgId)
                send(p, TOPIC, body, f"pay-{i}")
        p.shutdown()
        consumer, client = settings(namesrv, GROUP)
        runner = ConcurrentRunner(deduct, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(lambda: charged() == PAYMENTS and bool(failed_once), 60, "every charge")
            wait_until(
                lambda: stats("payments")["duplicates"] >= PAYMENTS // 5, 30, "the producer retries"
            )
        finally:
            runner.shutdown()
            strategy.close()
        with engine.connect() as conn:
            balance = conn.execute(sa.select(accounts.c.balance_cents)).scalar_one()
        counts = stats("payments")
        print(
            f"charges {charged()}, balance {balance} cents "
            f"(expected {100_000 - PAYMENTS * 1250}); processed {counts['processed']}, "
            f"duplicates {counts['duplicates']}, failures {counts['failures']}"
        )
        ok = charged() == PAYMENTS and balance == 100_000 - PAYMENTS * 1250
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
