"""``idemp consume``: consume with the concurrent runner or the OrderlyRunner and write
one JSON line per delivered message (to ``--record FILE`` or stdout).

Each line: pid, topic, queue, offset, msgId, keys, tags, reconsume times, the index
from the body (see ``idemp produce``), and the listener's start and end times
(``time.time()``; ``time`` is the delivery time); with ``--body`` the body too.

``--strategy URL`` runs each delivery through ``@idempotent`` on that backend (key from
``--key``): a line then says the outcome (``processed``, ``duplicates``, …), so a user
can watch dedup work on their own topic before writing a listener.

Lines are flushed one by one, so a process killed with SIGKILL loses no line for a
message it finished. SIGTERM (or SIGINT) stops it cleanly: the batch in hand finishes,
offsets are persisted, queue locks are released. Events (start, queue changes, stop)
go to stderr as JSON lines.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import sys
import threading
import time
from typing import IO, Any

_INDEX = re.compile(rb"^(\d+) ")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namesrv", required=True, help="nameserver host:port")
    p.add_argument("--topic", required=True, help="topic to subscribe to")
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--orderly", action="store_true", help="orderly (queue-locked) consumer")
    p.add_argument("--broadcast", action="store_true", help="broadcasting, not clustering")
    p.add_argument("--from", dest="from_", default="last", help="first, last or a ms timestamp")
    p.add_argument("--tags", default="*", help="subscription expression, e.g. 'a || b'")
    p.add_argument("--record", help="JSON lines file (default: stdout)")
    p.add_argument("--max", type=int, default=0, help="exit after N messages")
    p.add_argument("--idle-exit", type=float, default=0.0, help="exit after N idle seconds")
    p.add_argument(
        "--body",
        action="store_true",
        help="add the body to each line (text if UTF-8, else base64 with body_base64: true)",
    )
    s = p.add_argument_group("deduplication (what @idempotent would do)")
    s.add_argument(
        "--strategy",
        metavar="URL",
        help="run deliveries through @idempotent on this backend, e.g. sqlite:///dedup.db, "
        "redis://host:6379/0; each line gets its outcome",
    )
    s.add_argument(
        "--key",
        default="keys",
        help="business key: keys (the message keys, default), property:NAME or json:PATH",
    )
    t = p.add_argument_group("tuning (RocketMQ defaults unless given)")
    t.add_argument("--threads", type=int, default=20, help="consume threads")
    t.add_argument("--batch-size", type=int, default=1, help="consumeMessageBatchMaxSize")
    t.add_argument("--max-reconsume", type=int, default=16, help="-1: forever (orderly)")
    t.add_argument("--rebalance-interval", type=float, default=20.0, help="seconds")
    t.add_argument("--lock-renew-interval", type=float, default=20.0, help="seconds")
    t.add_argument("--lock-expiry", type=float, default=30.0, help="seconds")
    t.add_argument("--persist-interval", type=float, default=5.0, help="offset commit, s")
    t.add_argument("--pull-retry-delay", type=float, default=3.0, help="seconds")
    t.add_argument(
        "--commit-each-batch",
        action="store_true",
        help="orderly: push the offset to the broker after every batch",
    )
    t.add_argument("--request-timeout", type=float, default=3.0, help="seconds")
    t.add_argument("--instance-name", default="DEFAULT", help="client instance name")
    d = p.add_argument_group("testing")
    d.add_argument("--sleep-ms", type=float, default=0.0, help="work time per message")
    d.add_argument(
        "--fail-index",
        type=int,
        action="append",
        default=[],
        help="reconsume-later every delivery of the message with this index",
    )
    d.add_argument(
        "--fail-times",
        type=int,
        default=-1,
        help="with --fail-index: fail only this many deliveries",
    )


def _event(name: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from idemp.client import (
        ClientSettings,
        ConsumeFrom,
        ConsumerSettings,
        MessageModel,
        RemotingError,
    )
    from idemp.message import ConsumeResult, Message
    from idemp.runners import ConcurrentRunner, OrderlyRunner

    if args.from_ == "first":
        consume_from, ts = ConsumeFrom.FIRST_OFFSET, None
    elif args.from_ == "last":
        consume_from, ts = ConsumeFrom.LAST_OFFSET, None
    elif args.from_.isdigit():
        consume_from, ts = ConsumeFrom.TIMESTAMP, int(args.from_)
    else:
        print(f"error: --from {args.from_!r}: use first, last or a ms timestamp", file=sys.stderr)
        return 2
    settings = ConsumerSettings(
        group=args.group,
        message_model=MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING,
        consume_from=consume_from,
        consume_timestamp_ms=ts,
        consume_thread_count=args.threads,
        consume_batch_size=args.batch_size,
        max_reconsume_times=args.max_reconsume,
        lock_renew_interval=args.lock_renew_interval,
        lock_expiry=args.lock_expiry,
        pull_time_delay_when_exception=args.pull_retry_delay,
        commit_offset_each_batch=args.commit_each_batch,
    )
    client = ClientSettings(
        namesrv_addr=args.namesrv,
        instance_name=args.instance_name,
        rebalance_interval=args.rebalance_interval,
        persist_offset_interval=args.persist_interval,
        request_timeout=args.request_timeout,
        connect_timeout=args.request_timeout,
    )
    try:
        out: IO[str] = open(args.record, "a", encoding="utf-8") if args.record else sys.stdout
    except OSError as exc:
        print(f"idemp consume: cannot write {args.record}: {exc.strerror}", file=sys.stderr)
        return 2
    lock = threading.Lock()
    stop = threading.Event()
    state = {"count": 0, "last": time.monotonic()}
    fails: dict[int, int] = {}
    pid = os.getpid()
    fail_indexes = set(args.fail_index)

    def index_of(msg: Message) -> int | None:
        m = _INDEX.match(msg.body[:24])
        return int(m.group(1)) if m else None

    def work(msg: Message) -> ConsumeResult:
        if args.sleep_ms > 0:
            time.sleep(args.sleep_ms / 1000)
        index = index_of(msg)
        if index is not None and index in fail_indexes:
            with lock:
                n = fails[index] = fails.get(index, 0) + 1
            if args.fail_times < 0 or n <= args.fail_times:
                return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    dedup = _dedup_listener(args, work) if args.strategy else None
    if args.strategy and dedup is None:
        return 2

    def listener(msg: Message) -> ConsumeResult:
        start = time.time()
        index = index_of(msg)
        extra: dict[str, Any] = {}
        if dedup is not None:
            outcome = dedup(msg)
            result = outcome.consume_result
            extra["outcome"] = outcome.outcome.value
            if outcome.key is not None:
                extra["key"] = outcome.key
        else:
            result = work(msg)
        if args.body:
            extra.update(_body_fields(msg.body))
        line = json.dumps(
            {
                "pid": pid,
                "topic": msg.topic,
                "queue": msg.queue_id,
                "broker": msg.broker_name,
                "offset": msg.queue_offset,
                "msgId": msg.msg_id,
                "keys": list(msg.keys),
                "tags": msg.tags,
                "reconsume": msg.reconsume_times,
                "index": index,
                "ok": result is ConsumeResult.SUCCESS,
                "time": start,
                "start": start,
                "end": time.time(),
                **extra,
            }
        )
        with lock:
            out.write(line + "\n")
            out.flush()
            state["count"] += 1
            state["last"] = time.monotonic()
            if args.max and state["count"] >= args.max:
                stop.set()
        return result

    runner_cls = OrderlyRunner if args.orderly else ConcurrentRunner
    runner = runner_cls(listener, settings=settings, client=client)
    runner.subscribe(args.topic, args.tags)
    runner.consumer.on_queues_changed = lambda topic, mqs: _event(
        "queues",
        topic=topic,
        queues=sorted(m.queue_id for m in mqs),
        mqs=[f"{m.broker_name}:{m.queue_id}" for m in sorted(mqs)],  # ids repeat per broker
    )

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.start(timeout=max(args.request_timeout * 3, 10.0))
    except (RemotingError, TimeoutError, OSError) as exc:
        print(f"error: cannot start the consumer: {exc}", file=sys.stderr)
        return 1
    assert runner.consumer.instance is not None
    _event("started", pid=pid, clientId=runner.consumer.instance.client_id)
    state["last"] = time.monotonic()
    while not stop.wait(0.1):
        if args.idle_exit and time.monotonic() - state["last"] > args.idle_exit:
            break
    _event("stopping", pid=pid, consumed=state["count"])
    runner.shutdown()
    if out is not sys.stdout:
        out.close()
    _event("stopped", pid=pid, consumed=state["count"])
    return 0


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "body_base64": True}


def _dedup_listener(args: argparse.Namespace, work: Any) -> Any:
    """``work`` under ``@idempotent`` on ``--strategy``; None (and one line on stderr)
    when the URL or the key spec is wrong, so the mistake shows before consuming."""
    from idemp.config import strategy_from_url
    from idemp.message import ConsumeResult, Message
    from idemp.pipeline import idempotent
    from idemp.urls import mask_url

    try:
        strategy = strategy_from_url(args.strategy)
    except Exception as exc:
        reason = str(exc).replace(args.strategy, mask_url(args.strategy)).splitlines()[0]
        print(f"idemp consume: --strategy {mask_url(args.strategy)}: {reason}", file=sys.stderr)
        return None

    def handle(msg: Message) -> None:
        if work(msg) is not ConsumeResult.SUCCESS:
            raise RuntimeError("--fail-index: this delivery fails")

    try:
        return idempotent(key=args.key, strategy=strategy, group=args.group, name="consume")(handle)
    except (ValueError, TypeError) as exc:
        print(f"idemp consume: --key {args.key}: {exc}", file=sys.stderr)
        return None
