"""``idemp dlq``: a consumer group's dead letters, listed and sent back to the group.

A message a group could not process ends in ``%DLQ%<group>`` (after its retries, or at
once when a listener returns ``DEAD_LETTER``), and RocketMQ keeps it there: nothing
deletes a dead letter, mqadmin prints it, and only the dashboard resends one. ``replay``
sends the chosen dead letters to ``%RETRY%<group>``, as a client's own send-back does, so
that only that group gets them again, restored by its client to their original topic
(``RETRY_TOPIC``), with their keys, tags, properties and message id (``UNIQ_KEY``), and
a reconsume count of 0: the whole retry schedule again. The dead letters stay where they
were; a replayed message a listener handled before is absorbed as a duplicate by idemp's
strategies, as any redelivery.

    idemp dlq list --namesrv 127.0.0.1:9876 --group billing
    idemp dlq replay --namesrv 127.0.0.1:9876 --group billing --msg-id 7F0000…
    idemp dlq replay --namesrv 127.0.0.1:9876 --group billing --from-offset 12

On a cluster each broker keeps the dead letters of the messages it held, in a DLQ queue
of its own: ``list`` names each letter's broker, and an offset means something only with
its broker (``--from-offset 12 --broker broker-b``).

ACL and TLS come from the environment (IDEMP_ACCESS_KEY, IDEMP_SECRET_KEY,
IDEMP_USE_TLS), as for every client of idemp's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from idemp.client.producer import OutMessage, Producer, SendResult
from idemp.client.route import MessageQueue
from idemp.client.settings import ClientSettings
from idemp.remoting import MessageExt
from idemp.remoting.codes import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    Prop,
    pop_retry_topic,
    wrap_namespace,
)
from idemp.tools.history_pull import HistoryError, HistoryPuller, TimeRange

#: what a broker or a pull adds to a stored message, dropped before it is sent again
#: (a DELAY left in would delay it again; the broker sets the others itself)
_NOT_RESENT = frozenset(
    {
        Prop.DELAY,
        Prop.REAL_TOPIC,
        Prop.REAL_QID,
        Prop.MIN_OFFSET,
        Prop.MAX_OFFSET,
        Prop.WAIT,
        Prop.CLUSTER,
    }
)
REPLAY_PRODUCER_GROUP = "idemp-dlq-replay"


#: a dead letter: the broker whose DLQ queue holds it, its offset there, the message
Letter = tuple[str, int, MessageExt]


def dead_letters(namesrv_addr: str, group: str) -> list[tuple[int, MessageExt]]:
    """Every message in ``%DLQ%<group>``, with its queue offset, oldest first; none when
    the group never dead-lettered one (RocketMQ creates the topic at the first). On a
    cluster each broker's offsets count on their own."""
    with HistoryPuller(namesrv_addr) as puller:
        return [(offset, m) for _, offset, m in _letters(puller, _dlq_queues(puller, group))]


def _dlq_queues(puller: HistoryPuller, group: str, broker: str | None = None) -> list[MessageQueue]:
    queues = puller.queues(DLQ_GROUP_TOPIC_PREFIX + group) or []
    return [mq for mq in queues if broker is None or mq.broker_name == broker]


def _letters(puller: HistoryPuller, queues: list[MessageQueue]) -> list[Letter]:
    """Oldest first: one DLQ queue per broker (DLQ_NUMS_PER_GROUP), interleaved by the
    time each letter was stored."""
    out: list[Letter] = []
    for mq in queues:
        lo, hi = puller.offset_range(mq, TimeRange())
        out.extend(
            (mq.broker_name, m.queue_offset, m) for m in puller.pull(mq, lo, hi, decompress=True)
        )
    return sorted(out, key=lambda item: (item[2].store_timestamp, item[0], item[1]))


def _broadcasting(puller: HistoryPuller, queues: list[MessageQueue], group: str) -> bool:
    """Whether ``group``'s online consumers consume by broadcasting: they do not read
    ``%RETRY%<group>``, so a replay there would reach none of them (offline: unknown)."""
    return any(puller.consumer_model(mq, group) == "BROADCASTING" for mq in queues)


def retry_route(msg: MessageExt, group: str) -> tuple[str, str]:
    """(the retry topic a replay goes to, the dead letter's original topic).

    A 4.x consumer's dead letter names its original topic in RETRY_TOPIC, and the group
    reads ``%RETRY%<group>``. A RocketMQ 5 consumer (POP) reads ``%RETRY%<group>_<topic>``
    instead (KeyBuilder's POP retry topic; ``+`` in its V2 form), and its dead letter
    names that topic in RETRY_TOPIC when it came from there (RocketMQ 5.3.3, and idemp's
    broker since 2026-11-27; before, idemp's named the original topic, and 1ST_POP_TIME
    tells such a dead letter from a 4.x one)."""
    named = msg.properties.get(Prop.RETRY_TOPIC) or msg.topic
    if named.startswith(RETRY_GROUP_TOPIC_PREFIX):
        for prefix in (pop_retry_topic(group, "", v2=True), pop_retry_topic(group, "")):
            if named.startswith(prefix):
                return named, named[len(prefix) :]
        return named, named
    if Prop.FIRST_POP_TIME in msg.properties:
        return pop_retry_topic(group, named), named
    return RETRY_GROUP_TOPIC_PREFIX + group, named


def resend_message(msg: MessageExt, group: str, to: str | None = None) -> OutMessage:
    """The dead letter as a message to the group's retry topic (or to ``to``)."""
    target, _ = retry_route(msg, group)
    props = {k: v for k, v in msg.properties.items() if k not in _NOT_RESENT}
    # a dead letter always has its original topic; a message sent to the DLQ by hand
    # may not, and then its topic as stored is the best there is
    props.setdefault(Prop.RETRY_TOPIC, msg.topic)
    props.setdefault(Prop.ORIGIN_MESSAGE_ID, msg.offset_msg_id)
    return OutMessage(to or target, msg.body, properties=props, flag=msg.flag)


def replay(
    namesrv_addr: str, group: str, chosen: Sequence[MessageExt], to: str | None = None
) -> list[tuple[MessageExt, SendResult]]:
    """Send ``chosen`` (dead letters of ``group``) to the group's retry topic."""
    sent: list[tuple[MessageExt, SendResult]] = []
    with Producer(namesrv_addr, REPLAY_PRODUCER_GROUP) as producer:
        for msg in chosen:
            sent.append((msg, producer.send(resend_message(msg, group, to))))
    return sent


def describe(broker: str, offset: int, msg: MessageExt, group: str) -> dict[str, Any]:
    body = msg.body.decode("utf-8", "replace")
    _, original = retry_route(msg, group)
    return {
        "broker": broker,
        "offset": offset,
        "msg_id": msg.uniq_key or msg.offset_msg_id,
        "topic": original,
        "keys": msg.keys,
        "tags": msg.tags,
        "reconsume_times": msg.reconsume_times,
        "stored": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(msg.store_timestamp / 1000)),
        "body": body if len(body) <= 60 else body[:57] + "...",
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dlq_command", required=True)
    for name, text in (
        ("list", "print a group's dead letters (%%DLQ%%<group>)"),  # argparse: %% is %
        ("replay", "send dead letters back to their group (via %%RETRY%%<group>)"),
    ):
        one = sub.add_parser(name, help=text)
        one.add_argument("--namesrv", required=True, help="the nameserver (host:port)")
        one.add_argument("--group", required=True, help="the consumer group")
        one.add_argument(
            "--broker",
            metavar="NAME",
            help="only this broker's dead letters (on a cluster, each broker has its own)",
        )
        if name == "list":
            one.add_argument("--json", action="store_true", help="one JSON object per line")
            continue
        which = one.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--msg-id",
            action="append",
            help="a dead letter's message id (as `list` shows it, or its offset id); repeatable",
        )
        which.add_argument(
            "--from-offset",
            type=int,
            help="every dead letter from this DLQ queue offset on (as `list` shows them; "
            "on a cluster, with --broker: each broker counts its own)",
        )
        which.add_argument("--all", action="store_true", help="every dead letter of the group")
        one.add_argument(
            "--to",
            metavar="TOPIC",
            help="send to this topic instead of the group's retry topic (which `replay` "
            "picks: %%RETRY%%<group>, or a RocketMQ 5 consumer's %%RETRY%%<group>_<topic>)",
        )


def run(args: argparse.Namespace) -> int:
    try:
        # a group in a namespace (IDEMP_NAMESPACE, as its consumers' ClientSettings) is
        # ns%group on the wire: its dead letters are in %DLQ%ns%group
        namespace = ClientSettings(namesrv_addr=args.namesrv).namespace
    except ValueError as exc:
        print(f"idemp dlq: {exc}", file=sys.stderr)
        return 2
    args.group = wrap_namespace(namespace, args.group)
    try:
        with HistoryPuller(args.namesrv) as puller:  # one client for the reads
            queues = _dlq_queues(puller, args.group, args.broker)
            letters = _letters(puller, queues)
            # a replay to the group's retry topic: does any consumer read it?
            to_retry = args.dlq_command == "replay" and args.to is None and bool(letters)
            fanned_out = to_retry and _broadcasting(puller, queues, args.group)
    except HistoryError as exc:
        print(f"idemp dlq: {exc}", file=sys.stderr)
        return 1
    if args.dlq_command == "list":
        return _list(args, letters)
    if args.all:
        chosen = [m for _, _, m in letters]
    elif args.from_offset is not None:
        brokers = sorted({b for b, _, _ in letters})
        if len(brokers) > 1:
            print(
                f"idemp dlq: the dead letters of {args.group} are on {', '.join(brokers)}, "
                "each broker with offsets of its own: give --broker NAME with --from-offset; "
                "nothing sent",
                file=sys.stderr,
            )
            return 2
        chosen = [m for _, off, m in letters if off >= args.from_offset]
    else:
        wanted = set(args.msg_id)
        chosen = [m for _, _, m in letters if {m.uniq_key, m.offset_msg_id} & wanted]
        missing = wanted - {m.uniq_key for m in chosen} - {m.offset_msg_id for m in chosen}
        if missing:
            print(
                f"idemp dlq: not in %DLQ%{args.group}: {', '.join(sorted(missing))}; nothing sent",
                file=sys.stderr,
            )
            return 1
    if not chosen:
        print(f"no dead letters of {args.group}{_on(args)} to replay")
        return 0
    if fanned_out:
        print(
            f"idemp dlq: {args.group} consumes by broadcasting: its consumers do not read "
            f"%RETRY%{args.group}; replay with --to <topic> (every group reading that topic "
            "gets the message again; decorated listeners skip what they applied); nothing sent",
            file=sys.stderr,
        )
        return 2
    for msg, result in replay(args.namesrv, args.group, chosen, args.to):
        print(
            f"replayed {msg.uniq_key or msg.offset_msg_id} ({retry_route(msg, args.group)[1]}) "
            f"to {wrap_namespace(namespace, result.queue.topic)} at offset {result.queue_offset}"
        )
    return 0


def _list(args: argparse.Namespace, letters: list[Letter]) -> int:
    rows = [describe(broker, offset, msg, args.group) for broker, offset, msg in letters]
    if args.json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return 0
    if not rows:
        print(f"no dead letters of {args.group}{_on(args)}")
        return 0
    print(f"{len(rows)} dead letters of {args.group}{_on(args)} (%DLQ%{args.group}), oldest first:")
    for r in rows:
        print(
            f"  {r['broker']} offset {r['offset']}  {r['msg_id']}  topic {r['topic']}  "
            f"keys {r['keys']}  "
            f"tags {r['tags']}  reconsumed {r['reconsume_times']}  stored {r['stored']}  "
            f"body {r['body']!r}"
        )
    return 0


def _on(args: argparse.Namespace) -> str:
    return f" on {args.broker}" if args.broker else ""
