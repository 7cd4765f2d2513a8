"""``idemp consume``: consume with the concurrent runner or the OrderlyRunner and write
one JSON line per delivered message (to ``--record FILE`` or stdout).

Each line: pid, topic, queue, offset, msgId, keys, tags, reconsume times, the index
from the body (see ``idemp produce``), and the listener's start and end times
(``time.time()``; ``time`` is the delivery time). Lines are flushed one by one, so a
process killed with SIGKILL loses no line for a message it finished. SIGTERM (or
SIGINT) stops it cleanly: the batch in hand finishes, offsets are persisted, queue
locks are released. Events (start, queue changes, stop) go to stderr as JSON lines.
"""

from __future__ import annotations

import argparse
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

    def listener(msg: Message) -> ConsumeResult:
        start = time.time()
        m = _INDEX.match(msg.body[:24])
        index = int(m.group(1)) if m else None
        if args.sleep_ms > 0:
            time.sleep(args.sleep_ms / 1000)
        result = ConsumeResult.SUCCESS
        if index is not None and index in fail_indexes:
            with lock:
                n = fails[index] = fails.get(index, 0) + 1
            if args.fail_times < 0 or n <= args.fail_times:
                result = ConsumeResult.RECONSUME_LATER
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
        "queues", topic=topic, queues=sorted(m.queue_id for m in mqs)
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
