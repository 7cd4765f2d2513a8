"""``idemp produce``: send test messages and print a summary.

Every generated body starts with the message's index as decimal text and a space,
so a consumer's record shows which message it got. With ``--sharding-key-count K``
message i is sent orderly with sharding key and message key ``key-<i mod K>``
(queue = std::hash(key) % queues, as the official client).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemp.client import MessageQueue


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namesrv", required=True, help="HOST:PORT[;HOST:PORT]")
    p.add_argument("--topic", required=True, help="topic to send to")
    p.add_argument("--group", default="idemp-produce", help="producer group")
    p.add_argument("--count", type=int, default=1, help="messages to send")
    p.add_argument("--skip", type=int, default=0, help="first index (indices skip..count-1)")
    p.add_argument("--keys-from", help="file with one message key per line (used in turn)")
    p.add_argument(
        "--sharding-key-count", type=int, default=0, metavar="K", help="K > 0: spread over K keys"
    )
    p.add_argument("--tag", help="message tag")
    p.add_argument("--delay-level", type=int, default=0, help="RocketMQ delay level, 0: none")
    body = p.add_mutually_exclusive_group()
    body.add_argument(
        "--body-size", type=int, default=32, metavar="B", help="random body of B bytes"
    )
    body.add_argument("--body-file", metavar="F", help="send the bytes of file F")
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: no limit)")
    p.add_argument("--batch", type=int, default=0, help="send in batches of this size")
    p.add_argument("--record", help="write one JSON line per sent message to this file")
    p.add_argument("--timeout", type=float, default=3.0, help="send timeout, seconds")
    p.add_argument("--queue-nums", type=int, default=4, help="queues of an auto-created topic")


def make_body(i: int, size: int) -> bytes:
    head = f"{i} ".encode()
    return head + b"x" * max(0, size - len(head))


def run(args: argparse.Namespace) -> int:
    from idemp.client import ClientSettings, OutMessage, Producer, ProducerSettings, RemotingError

    keys: list[str] = []
    try:
        if args.keys_from:
            text = Path(args.keys_from).read_text()
            keys = [k.strip() for k in text.splitlines() if k.strip()]
        file_body = Path(args.body_file).read_bytes() if args.body_file else None
    except OSError as e:  # one line naming the file, not a traceback
        print(f"idemp produce: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    settings = ProducerSettings(
        group=args.group, send_timeout=args.timeout, default_topic_queue_nums=args.queue_nums
    )
    client = ClientSettings(namesrv_addr=args.namesrv, request_timeout=args.timeout)
    record: IO[str] | None = open(args.record, "a", encoding="utf-8") if args.record else None
    queues: Counter[int] = Counter()
    brokers: Counter[str] = Counter()  # a queue id alone is ambiguous in a cluster
    failures: list[str] = []
    sent = 0
    producer = Producer(settings=settings, client=client)
    t0 = time.monotonic()
    try:
        producer.start()
        pending: list[Any] = []
        for i in range(args.skip, args.count):
            if args.rate > 0:
                delay = t0 + (i - args.skip) / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            shard = f"key-{i % args.sharding_key_count}" if args.sharding_key_count else None
            key = shard or (keys[i % len(keys)] if keys else None)
            msg = OutMessage(
                args.topic,
                file_body if file_body is not None else make_body(i, args.body_size),
                tags=args.tag,
                keys=[key] if key else [],
                delay_level=args.delay_level,
            )
            if args.batch > 1 and shard is None:
                pending.append((i, key, msg))
                if len(pending) < args.batch and i < args.count - 1:
                    continue
                batch, pending = pending, []
                try:
                    res = producer.send_batch([m for _, _, m in batch])
                except RemotingError as exc:
                    failures.append(f"{batch[0][0]}..{batch[-1][0]}: {exc}")
                    continue
                ids = res.msg_id.split(",")
                for n, (idx, k, _) in enumerate(batch):
                    queues[res.queue.queue_id] += 1
                    brokers[res.queue.broker_name] += 1
                    sent += 1
                    _record(record, idx, k, res.queue, res.queue_offset + n, ids[n])
                continue
            try:
                if shard is not None:
                    res = producer.send_orderly(msg, shard)
                else:
                    res = producer.send(msg)
            except RemotingError as exc:
                failures.append(f"{i}: {exc}")
                continue
            sent += 1
            queues[res.queue.queue_id] += 1
            brokers[res.queue.broker_name] += 1
            _record(record, i, key, res.queue, res.queue_offset, res.msg_id)
    except RemotingError as exc:
        failures.append(str(exc))
    finally:
        producer.shutdown()
        if record is not None:
            record.close()
    elapsed = time.monotonic() - t0
    summary = {
        "topic": args.topic,
        "sent": sent,
        "failed": args.count - args.skip - sent,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(sent / elapsed, 1) if elapsed > 0 else None,
        "queues": {str(q): n for q, n in sorted(queues.items())},
        "brokers": dict(sorted(brokers.items())),
    }
    print(json.dumps(summary))
    for f in failures[:10]:
        print(f"error: {f}", file=sys.stderr)
    return 0 if sent == args.count - args.skip else 1


def _record(
    out: IO[str] | None, i: int, key: str | None, mq: MessageQueue, offset: int, mid: str
) -> None:
    if out is not None:
        row = {"index": i, "key": key, "broker": mq.broker_name, "queue": mq.queue_id}
        out.write(json.dumps({**row, "offset": offset, "msgId": mid}) + "\n")
