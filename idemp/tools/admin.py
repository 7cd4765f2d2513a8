"""``idemp admin``: what RocketMQ's mqadmin does for topics and groups, for a broker at hand.

RocketMQ 5 clients need their topics created first, with a message type, and FIFO groups
marked as such (the proxy auto-creates neither); ``mqadmin updateTopic -a
+message.type=FIFO`` and ``updateSubGroup -o true`` do it on RocketMQ, these commands send
the same requests (UPDATE_AND_CREATE_TOPIC, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) to idemp's
broker or to a RocketMQ broker:

    idemp admin update-topic --broker 127.0.0.1:10911 --topic Orders --type FIFO
    idemp admin update-sub-group --broker 127.0.0.1:10911 --group billing --fifo

A broker with ACL on needs an admin account's IDEMP_ACCESS_KEY and IDEMP_SECRET_KEY;
IDEMP_USE_TLS=true talks TLS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys

from idemp.client.settings import ClientSettings
from idemp.remoting import FrameDecoder, RemotingCommand, RequestCode, encode

TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_opaques = itertools.count(1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="admin_command", required=True)
    topic = sub.add_parser("update-topic", help="create or update a topic (mqadmin updateTopic)")
    topic.add_argument("--broker", required=True, help="the broker's host:port (remoting)")
    topic.add_argument("--topic", required=True, help="the topic to create or update")
    topic.add_argument("--queues", type=int, default=8, help="read and write queues (default 8)")
    topic.add_argument(
        "--type",
        choices=TYPES,
        help="RocketMQ 5's message type (attribute message.type; default NORMAL)",
    )
    group = sub.add_parser(
        "update-sub-group", help="create or update a consumer group (mqadmin updateSubGroup)"
    )
    group.add_argument("--broker", required=True, help="the broker's host:port (remoting)")
    group.add_argument("--group", required=True, help="the consumer group to create or update")
    group.add_argument(
        "--fifo", action="store_true", help="a FIFO group for RocketMQ 5 consumers (orderly)"
    )
    group.add_argument(
        "--retry-max", type=int, default=16, help="retryMaxTimes: retries before the DLQ"
    )


def request(addr: str, cmd: RemotingCommand, timeout: float = 10.0) -> RemotingCommand:
    """One request on a fresh connection, its response. Signed and over TLS as the
    environment says (IDEMP_ACCESS_KEY/IDEMP_SECRET_KEY, an admin account; IDEMP_USE_TLS),
    as every client of idemp's."""
    host, _, port = addr.rpartition(":")
    decoder = FrameDecoder()
    settings = ClientSettings()
    sign, tls = settings.signer(), settings.tls_context()
    if sign is not None:
        sign(cmd)
    with (
        socket.create_connection((host, int(port)), timeout=timeout) as plain,
        tls.wrap_socket(plain) if tls is not None else plain as sock,
    ):
        sock.sendall(encode(cmd))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"{addr} closed the connection without an answer")
            for answer in decoder.feed(data):
                if answer.is_response and answer.opaque == cmd.opaque:
                    return answer


def update_topic(addr: str, topic: str, queues: int = 8, message_type: str | None = None) -> None:
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    if message_type:
        ext["attributes"] = f"+message.type={message_type}"
    _check(request(addr, _command(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)), f"topic {topic}")


def update_sub_group(addr: str, group: str, fifo: bool = False, retry_max: int = 16) -> None:
    body = {"groupName": group, "consumeMessageOrderly": fifo, "retryMaxTimes": retry_max}
    cmd = _command(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(body).encode())
    _check(request(addr, cmd), f"group {group}")


def _command(code: int, ext: dict[str, str], body: bytes = b"") -> RemotingCommand:
    return RemotingCommand(code=code, opaque=next(_opaques), ext_fields=ext, body=body)


def _check(answer: RemotingCommand, what: str) -> None:
    if answer.code != 0:
        raise RuntimeError(f"{what}: the broker answered {answer.code}: {answer.remark}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.admin_command == "update-topic":
            update_topic(args.broker, args.topic, args.queues, args.type)
            print(f"topic {args.topic}: {args.queues} queues, type {args.type or 'NORMAL'}")
        else:
            update_sub_group(args.broker, args.group, args.fifo, args.retry_max)
            kind = "FIFO" if args.fifo else "concurrent"
            print(f"group {args.group}: {kind}, retryMaxTimes {args.retry_max}")
    except (OSError, RuntimeError) as exc:
        print(f"idemp admin: {exc}", file=sys.stderr)
        return 1
    return 0
