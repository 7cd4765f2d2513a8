"""The gRPC endpoint's transport, against grpc's own clients: flow control with messages
larger than every window, compression, limits, deadlines, what is not HTTP/2, and the
writes of one turn of the loop leaving together."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest

from idemp.broker.config import BrokerConfig
from idemp.broker.process import BrokerProcess
from idemp.broker.tls import ServerTls
from idemp.broker.v5 import endpoint, http2
from idemp.broker.v5.schema import SERVICE, pb
from idemp.broker.v5.service import Rpc
from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5
from .raw import METADATA, Raw, resource, simple_consumer


def _query_route(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        f"/{SERVICE}/QueryRoute",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.QueryRouteResponse.FromString,
    )


def test_bodies_larger_than_every_window_go_both_ways(
    broker5: Endpoint5, admin: RawClient, names: Callable[[str], str], tmp_path: Path
) -> None:
    """Three messages of 1.5 MB (random, so the client's compression keeps most of it): the
    server reads past its 1 MiB windows and gives them back; a receive of all three waits
    on the client's windows, which start at 64 KiB."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    bodies = [base64.b64encode(os.urandom(1_100_000)).decode() for _ in range(3)]
    client = Client5(broker5.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("producer", name="p", topics=[topic])
        sent = client.ok("send", name="p", messages=[{"topic": topic, "body": b} for b in bodies])
        assert len(sent["receipts"]) == 3
        client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
        got = client.receive_until(3, within=30)
    finally:
        client.close()
    assert sorted(m["body"] for m in got) == sorted(bodies)


def test_a_gzip_request_is_read_and_other_encodings_are_refused_as_the_proxy_does(
    broker5: Endpoint5,
) -> None:
    """grpc-java, which RocketMQ's proxy serves on, decompresses gzip and nothing else."""
    request = pb.QueryRouteRequest(topic=resource("T" * 4000))  # compressible: sent gzipped
    with closing(grpc.insecure_channel(broker5.grpc_addr, compression=grpc.Compression.Gzip)) as ch:
        answer = _query_route(ch)(request, metadata=METADATA, timeout=10)
    assert (answer.status.code, answer.status.message) == (
        pb.ILLEGAL_TOPIC,
        "The specified topic is longer than topic max length 127.",
    )
    deflate = grpc.Compression.Deflate
    with closing(grpc.insecure_channel(broker5.grpc_addr, compression=deflate)) as ch:
        with pytest.raises(grpc.RpcError) as refused:
            _query_route(ch)(request, metadata=METADATA, timeout=10)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "Can't find decompressor for deflate",
    )


def test_a_request_over_the_proxys_limit_is_refused_and_the_server_goes_on(
    raw: Raw, broker5: Endpoint5
) -> None:
    """RocketMQ's proxy reads requests up to 130 MB (grpcMaxInboundMessageSize); the
    length is checked from the message's prefix, before anything of it is buffered."""
    if broker5.real:
        pytest.skip("RocketMQ's proxy resets the stream (CANCEL) while the request is sent")
    too_big = b"\x0a" + b"\x00" * endpoint.MAX_MESSAGE_BYTES  # declared longer than the limit
    with pytest.raises(grpc.RpcError) as refused:
        raw.unary("QueryRoute", too_big, pb.QueryRouteResponse)
    limit = endpoint.MAX_MESSAGE_BYTES
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"gRPC message larger than max ({limit + 1} vs. {limit})",
    )
    answer = raw.unary("QueryRoute", pb.QueryRouteRequest(), pb.QueryRouteResponse)
    assert answer.status.code == pb.ILLEGAL_TOPIC


def test_what_is_not_http2_gets_a_goaway_and_the_server_goes_on(
    broker5: Endpoint5, raw: Raw
) -> None:
    host, port = broker5.grpc_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):  # the server closes: recv returns b""
            received += chunk
    kinds = []
    while received:
        length = int.from_bytes(received[:3], "big")
        kinds.append(received[3])
        last = received[9 : 9 + length]
        received = received[9 + length :]
    assert kinds == [http2.SETTINGS, http2.WINDOW_UPDATE, http2.GOAWAY]
    assert struct.unpack(">II", last[:8]) == (0, http2.PROTOCOL_ERROR)
    assert last[8:] == b"Unexpected HTTP/1.x request: GET / "  # Netty's words
    answer = raw.unary("QueryRoute", pb.QueryRouteRequest(), pb.QueryRouteResponse)
    assert answer.status.code == pb.ILLEGAL_TOPIC


def test_the_callers_deadline_reaches_the_long_poll(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """The endpoint reads the call's grpc-timeout; the service polls for the time left,
    and a deadline too near for the shortest poll (5 s) is refused as the proxy does."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    settings, request = simple_consumer(group, topic)
    assert raw.first_telemetry(settings).status.code == pb.OK  # RocketMQ wants them first
    call: Any = raw.channel.unary_stream(
        f"/{SERVICE}/ReceiveMessage",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ReceiveMessageResponse.FromString,
    )
    answers = list(call(request, metadata=METADATA, timeout=4))
    assert [a.WhichOneof("content") for a in answers] == ["status", "delivery_timestamp"]
    assert (answers[0].status.code, answers[0].status.message) == (
        pb.ILLEGAL_POLLING_TIME,
        "The deadline time remaining is not enough for polling, please check network condition",
    )


# --- the writes of one turn (pure logic: a fake service on the real connection) --------


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


class _Endpoint:
    def __init__(self, rpcs: dict[str, Rpc]) -> None:
        self.rpcs = {f"/{SERVICE}/{name}": rpc for name, rpc in rpcs.items()}
        self.connections: set[Any] = set()
        self.all_closed = asyncio.Event()
        self.tls = ServerTls(BrokerConfig())
        self.idle_s = 120.0

    def forget(self, connection: Any) -> None:
        self.connections.discard(connection)


def _request(path: str, stream_id: int, message: bytes, encoder: hpack.Encoder) -> bytes:
    block = encoder.encode(
        [(":method", "POST"), (":path", path), ("content-type", "application/grpc")]
    )
    prefix = b"\x00" + len(message).to_bytes(4, "big")
    return _frame(http2.HEADERS, http2.END_HEADERS, stream_id, block) + _frame(
        http2.DATA, http2.END_STREAM, stream_id, prefix + message
    )


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


def _kinds(data: bytes) -> list[tuple[int, int]]:
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big")))
        data = data[9 + length :]
    return out


def test_a_streams_responses_and_answers_of_one_turn_leave_in_one_write() -> None:
    async def stream(request: Any, call: Any) -> AsyncIterator[Any]:
        for n in range(34):
            yield pb.QueryRouteResponse(status=pb.Status(message=f"r{n}"))

    async def unary(request: Any, call: Any) -> Any:
        return pb.QueryRouteResponse(
            status=pb.Status(message=dict(call.invocation_metadata())["x-a"])
        )

    async def scenario() -> list[list[tuple[int, int]]]:
        fake = _Endpoint(
            {
                "Stream": Rpc("server_stream", stream, pb.QueryRouteRequest, pb.QueryRouteResponse),
                "Unary": Rpc("unary", unary, pb.QueryRouteRequest, pb.QueryRouteResponse),
            }
        )
        transport = _Transport()
        conn = endpoint._Connection(fake)  # type: ignore[arg-type]
        conn.connection_made(transport)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        encoder = hpack.Encoder()
        conn.data_received(http2.PREFACE + _frame(http2.SETTINGS, 0, 0, b""))
        conn.data_received(_request(f"/{SERVICE}/Stream", 1, b"", encoder))
        for _ in range(3):  # the task starts, runs, the flush follows
            await asyncio.sleep(0)
        fields = [
            (":method", "POST"),
            (":path", f"/{SERVICE}/Unary"),
            ("content-type", "application/grpc"),
            ("x-a", "v"),
        ]
        acks = b"".join(  # each block after the last: they share the encoder's table
            _frame(http2.HEADERS, http2.END_HEADERS, sid, encoder.encode(fields))
            + _frame(http2.DATA, http2.END_STREAM, sid, b"\x00\x00\x00\x00\x00")
            for sid in (3, 5, 7)
        )
        conn.data_received(acks)  # three calls arriving together
        for _ in range(3):
            await asyncio.sleep(0)
        return [_kinds(w) for w in transport.writes]

    writes = asyncio.run(scenario())
    settings, ack = (http2.SETTINGS, 0), (http2.WINDOW_UPDATE, 0)
    # the server's preface waits for the client's first bytes (TLS or not), so it leaves
    # with the ack of the client's SETTINGS
    assert writes[0] == [settings, ack, (http2.SETTINGS, 0)]
    responses = [(http2.HEADERS, 1)] + [(http2.DATA, 1)] * 34 + [(http2.HEADERS, 1)]
    assert writes[1] == responses
    assert writes[2] == [
        (k, sid) for sid in (3, 5, 7) for k in (http2.HEADERS, http2.DATA, http2.HEADERS)
    ]
    assert len(writes) == 3


def _read_frames(sock: socket.socket, seconds: float) -> tuple[list[tuple[int, int, bytes]], bool]:
    """What the server sends within ``seconds`` (each read bounded by the socket's
    timeout): its frames, and whether it closed the connection."""
    sock.settimeout(seconds)
    data = b""
    closed = False
    try:
        while chunk := sock.recv(65536):
            data += chunk
        closed = True
    except TimeoutError:
        pass
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big"), data[9 : 9 + length]))
        data = data[9 + length :]
    return out, closed


def test_a_connection_without_a_call_is_sent_away_after_the_idle_time(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """The proxy's grpcClientIdleTimeMills (120 s; 0.4 s here), grpc-java's
    maxConnectionIdle: an open Telemetry stream keeps its connection; once the last call
    ends, the idle time runs and a GOAWAY (NO_ERROR) ends the connection."""
    broker = make_broker(grpcClientIdleTimeMills=400)
    host, port = broker.grpc_addr.rsplit(":", 1)
    encoder = hpack.Encoder()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/{SERVICE}/Telemetry"),
        ("content-type", "application/grpc"),
        ("x-mq-client-id", "idle-client"),
    ]
    settings = pb.TelemetryCommand(
        settings=pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[resource("IdleT")])
        )
    ).SerializeToString()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            http2.PREFACE
            + _frame(http2.SETTINGS, 0, 0, b"")
            + _frame(http2.HEADERS, http2.END_HEADERS, 1, encoder.encode(headers))
            + _frame(http2.DATA, 0, 1, b"\x00" + len(settings).to_bytes(4, "big") + settings)
        )
        # three idle times with the stream open: answered, not sent away
        during, closed = _read_frames(sock, 1.2)
        assert not closed and http2.GOAWAY not in [k for k, _, _ in during]
        assert (http2.DATA, 1) in [(k, s) for k, s, _ in during]  # the settings' answer
        sock.sendall(_frame(http2.RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL)))
        after, closed = _read_frames(sock, 10)
    assert closed
    # RocketMQ 5.3.3's proxy says "max_idle" too (then, as grpc-java does, a PING and a
    # second GOAWAY 10 s later; idemp closes at once: the connection has no call)
    assert [(k, s, p[4:]) for k, s, p in after] == [
        (http2.GOAWAY, 0, struct.pack(">I", http2.NO_ERROR) + b"max_idle")
    ]
