"""``idemp admin``: what RocketMQ's mqadmin does for topics and groups, for a broker at hand.

RocketMQ 5 clients need their topics created first, with a message type, and FIFO groups
marked as such (the proxy auto-creates neither); ``mqadmin updateTopic -a
+message.type=FIFO`` and ``updateSubGroup -o true`` do it on RocketMQ, these commands send
the same requests (UPDATE_AND_CREATE_TOPIC, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) to idemp's
broker or to a RocketMQ broker:

    idemp admin update-topic --broker 127.0.0.1:10911 --topic Orders --type FIFO
    idemp admin update-sub-group --broker 127.0.0.1:10911 --group billing --fifo
    idemp admin update-topic --namesrv 127.0.0.1:9876 --cluster DefaultCluster --topic Orders

With ``--namesrv`` and ``--cluster`` (mqadmin's ``-n … -c …``) every master broker of
the cluster, as the nameserver lists them, gets the request.

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
from idemp.remoting import FrameDecoder, RemotingCommand, RequestCode, encode, jsonlenient

TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_opaques = itertools.count(1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="admin_command", required=True)
    topic = sub.add_parser("update-topic", help="create or update a topic (mqadmin updateTopic)")
    _where(topic)
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
    _where(group)
    group.add_argument("--group", required=True, help="the consumer group to create or update")
    group.add_argument(
        "--fifo", action="store_true", help="a FIFO group for RocketMQ 5 consumers (orderly)"
    )
    group.add_argument(
        "--retry-max", type=int, default=16, help="retryMaxTimes: retries before the DLQ"
    )


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="the broker's host:port (remoting)")
    p.add_argument("--namesrv", help="a nameserver's host:port, with --cluster")
    p.add_argument("--cluster", help="every master broker of this cluster (mqadmin -c)")


def brokers_of(args: argparse.Namespace) -> list[str]:
    """The addresses a command goes to: ``--broker``, or the masters of ``--cluster``."""
    if args.broker and not (args.namesrv or args.cluster):
        return [str(args.broker)]
    if args.broker or not (args.namesrv and args.cluster):
        raise ValueError("give --broker, or --namesrv with --cluster")
    return cluster_masters(args.namesrv, args.cluster)


def cluster_masters(namesrv: str, cluster: str) -> list[str]:
    answer = request(namesrv, _command(RequestCode.GET_BROKER_CLUSTER_INFO, {}))
    _check(answer, "cluster info")
    info = jsonlenient.loads(answer.body)
    names = (info.get("clusterAddrTable") or {}).get(cluster)
    if not names:
        raise RuntimeError(f"cluster {cluster} has no broker at nameserver {namesrv}")
    table = info.get("brokerAddrTable") or {}
    out = []
    for name in sorted(names):
        addr = ((table.get(name) or {}).get("brokerAddrs") or {}).get("0")
        if addr:  # a broker name with slaves only has no master to create on
            out.append(str(addr))
    return out


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
        brokers = brokers_of(args)
    except ValueError as exc:
        print(f"idemp admin: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"idemp admin: {exc}", file=sys.stderr)
        return 1
    try:
        for addr in brokers:
            if args.admin_command == "update-topic":
                update_topic(addr, args.topic, args.queues, args.type)
                what = f"topic {args.topic}: {args.queues} queues, type {args.type or 'NORMAL'}"
            else:
                update_sub_group(addr, args.group, args.fifo, args.retry_max)
                kind = "FIFO" if args.fifo else "concurrent"
                what = f"group {args.group}: {kind}, retryMaxTimes {args.retry_max}"
            print(f"{what} on {addr}" if len(brokers) > 1 or not args.broker else what)
    except (OSError, RuntimeError) as exc:
        print(f"idemp admin: {exc}", file=sys.stderr)
        return 1
    return 0
