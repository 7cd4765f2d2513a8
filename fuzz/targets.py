"""Fuzz targets: plain functions ``target(data: bytes) -> None`` that raise only on a bug.

They do not import atheris, so the same inputs replay under pytest (the regression
corpus in ``fuzz/corpus``) and under the coverage-guided driver (``fuzz/run.py``).

Contracts checked:
- codec: ``FrameDecoder.feed`` raises only ``ProtocolError``; every decoded command
  re-encodes; ``decode_messages`` / ``decode_batch`` raise only ``MessageFormatError``;
  ``decode_properties`` never raises; ``jsonlenient.loads`` raises only ``ValueError``.
- dispatch: a frame fed to a broker ``Connection`` (a real ``BrokerServer`` on a temp
  store, a fake transport) never raises out of ``data_received``, never makes the broker
  log an ERROR (a handler bug: ``log.exception``), never reaches asyncio's exception
  handler, and everything written back is valid frames.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import tempfile
from pathlib import Path
from typing import Any

from idemp.remoting import (
    FrameDecoder,
    MessageFormatError,
    ProtocolError,
    RemotingCommand,
    decode_batch,
    decode_frame,
    decode_messages,
    decode_properties,
    encode,
    jsonlenient,
)

# --- codec -------------------------------------------------------------------------------


def codec(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 6, data[1:]
    if mode == 0:
        _feed_frames(rest)
    elif mode == 1:
        try:
            decode_messages(rest)
        except MessageFormatError:
            pass
    elif mode == 2:
        try:
            decode_batch(rest)
        except MessageFormatError:
            pass
    elif mode == 3:
        decode_properties(rest.decode("utf-8", "replace"))
    elif mode == 4:
        try:
            jsonlenient.loads(rest)
        except ValueError:
            pass
    else:  # a whole frame around the input, so the header parsers see every byte
        _feed_frames(struct.pack(">ii", 4 + len(rest), len(rest)) + rest)


def _feed_frames(data: bytes) -> None:
    decoder = FrameDecoder(max_frame=1 << 20)
    try:
        # split in two feeds at a data-chosen point: reassembly is part of the contract
        cut = data[0] % (len(data) + 1) if data else 0
        commands = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    except ProtocolError:
        return
    for cmd in commands:
        again = decode_frame(encode(cmd)[4:])
        assert again.code == cmd.code and again.ext_fields == cmd.ext_fields, (cmd, again)
        assert again.body == cmd.body


# --- broker dispatch ---------------------------------------------------------------------

# Every request code the broker or the nameserver serves, plus unknown ones.
CODES = [
    10,
    11,
    12,
    14,
    15,
    17,
    21,
    29,
    30,
    31,
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    41,
    42,
    105,
    106,
    200,
    201,
    206,
    310,
    320,
    9999,
    -1,
]
FIELDS = [
    "topic",
    "producerGroup",
    "consumerGroup",
    "group",
    "queueId",
    "queueOffset",
    "offset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "subVersion",
    "expressionType",
    "properties",
    "bornTimestamp",
    "flag",
    "reconsumeTimes",
    "maxReconsumeTimes",
    "batch",
    "defaultTopic",
    "defaultTopicQueueNums",
    "delayLevel",
    "originMsgId",
    "originTopic",
    "commitLogOffset",
    "commitOrRollback",
    "tranStateTableOffset",
    "transactionId",
    "msgId",
    "fromTransactionCheck",
    "key",
    "maxNum",
    "beginTimestamp",
    "endTimestamp",
    "timestamp",
    "readQueueNums",
    "writeQueueNums",
    "perm",
    "topicFilterType",
    "topicSysFlag",
    "order",
    "clientID",
    "unitMode",
    "acceptStandardJsonOnly",
    "_UNIQUE_KEY_QUERY",
    "AccessKey",
    "Signature",
    "OnsChannel",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
]
VALUES = [
    "",
    "0",
    "1",
    "-1",
    "2",
    "3",
    "4",
    "8",
    "16",
    "true",
    "false",
    "TopicA",
    "GroupA",
    "%RETRY%GroupA",
    "%DLQ%GroupA",
    "TBW102",
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "*",
    "TagA || TagB",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "1e3",
    "0x10",
    "KEYS\x01k\x02TAGS\x01TagA\x02DELAY\x012\x02",
    "TRAN_MSG\x01true\x02",
    "a" * 300,
    "7F0000010000000000000000",
    "127.0.0.1:10911",
    "\ud800",
    "null",
    "NaN",
]
_GOLDEN = Path(__file__).resolve().parents[1] / "tests/remoting/data/golden_frames.jsonl"


def golden_bodies() -> list[bytes]:
    bodies: list[bytes] = []
    try:
        lines = _GOLDEN.read_text(encoding="utf-8").splitlines()
    except OSError:
        return bodies
    for line in lines:
        hexed = json.loads(line).get("body_hex") or ""
        if hexed and bytes.fromhex(hexed) not in bodies:
            bodies.append(bytes.fromhex(hexed))
    return bodies


class _Reader:
    """Consumes fuzz bytes as small integers and slices (like atheris's data provider,
    but deterministic without atheris, so a corpus replays anywhere)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(len(self.data))


def build_request(data: bytes, bodies: list[bytes]) -> tuple[bytes, bool]:
    """Fuzz bytes -> (frame bytes, whether for the nameserver). Mode 0 is raw bytes."""
    r = _Reader(data)
    mode = r.byte()
    if mode % 8 == 0:
        return r.rest(), bool(mode & 8)
    code = CODES[r.byte() % len(CODES)]
    flag = r.byte() % 4 & 2  # request, sometimes oneway
    ext: dict[str, str] = {}
    for _ in range(r.byte() % 12):
        name = FIELDS[r.byte() % len(FIELDS)]
        choice = r.byte()
        if choice < 200:
            ext[name] = VALUES[choice % len(VALUES)]
        else:
            ext[name] = r.take(r.byte() % 40).decode("utf-8", "replace")
    which = r.byte()
    if which < 64 and bodies:
        body = bytearray(bodies[which % len(bodies)])
        for _ in range(r.byte() % 4):  # a few point mutations of a real body
            if body:
                body[(r.byte() << 8 | r.byte()) % len(body)] = r.byte()
        body += r.rest()
    else:
        body = bytearray(r.rest())
    cmd = RemotingCommand(code=code, opaque=mode, flag=flag, ext_fields=ext, body=bytes(body))
    if mode & 16:
        cmd.language, cmd.version = "CPP", 63
    if mode & 32:
        cmd.serialize_type = 1
    to_namesrv = code in (105, 106, 206) or bool(mode & 64)
    try:
        return encode(cmd), to_namesrv
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800") reaches a server only as a JSON escape: write the
        # header with ensure_ascii, as a Java client's fastjson may.
        header = json.dumps(
            {"code": code, "opaque": mode, "flag": flag, "extFields": ext, "version": 409}
        ).encode("ascii")
        prefix = struct.pack(">ii", 4 + len(header) + len(body), len(header))
        return prefix + header + bytes(body), to_namesrv


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class DispatchHarness:
    """One broker per process (starting one costs ~50 ms); each input gets a fresh
    Connection. The servers listen on free loopback ports nobody connects to."""

    def __init__(self) -> None:
        from idemp.broker.config import BrokerConfig
        from idemp.broker.server import BrokerServer

        self.tmp = tempfile.TemporaryDirectory(prefix="idemp-fuzz-")
        acl = Path(self.tmp.name) / "plain_acl.yml"
        acl.write_text(
            "accounts:\n  - accessKey: fuzzAccess\n    secretKey: fuzzSecret\n"
            "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: SUB\n",
            encoding="utf-8",
        )
        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.loop_errors.append(ctx))
        self.servers = []
        for i, acl_on in enumerate((False, True)):
            cfg = BrokerConfig(
                storePathRootDir=str(Path(self.tmp.name) / f"store{i}"),
                listenPort=0,
                namesrvAddr="127.0.0.1:0",
                aclEnable=acl_on,
                aclPlainFile=str(acl),
                maxMessageSize=64 * 1024,
            )
            server = BrokerServer(cfg)
            self.loop.run_until_complete(server.start())
            self.servers.append(server)
        self.errors = _Errors()
        logging.getLogger("idemp.broker").addHandler(self.errors)
        logging.getLogger("idemp.broker").propagate = False
        self.bodies = golden_bodies()

    def __call__(self, data: bytes) -> None:
        from idemp.broker.server import Connection

        frame, to_namesrv = build_request(data, self.bodies)
        server = self.servers[(data[1] if len(data) > 1 else 0) & 1]
        handlers = server.namesrv_handlers if to_namesrv else server.broker_handlers
        conn = Connection(server, handlers, "namesrv" if to_namesrv else "broker")
        transport = _FakeTransport()

        async def feed() -> None:
            """On the loop, as asyncio calls a protocol; in two halves, since the second
            may arrive after the first was dispatched."""
            conn.connection_made(transport)
            try:
                conn.data_received(frame[: len(frame) // 2])
                conn.data_received(frame[len(frame) // 2 :])
                for _ in range(3):  # let awaitable results (SYNC_FLUSH sends, ...) finish
                    await asyncio.sleep(0)
            finally:
                conn.connection_lost(None)
                await asyncio.sleep(0)

        self.loop.run_until_complete(feed())
        if self.errors.records:
            rec = self.errors.records[:]
            self.errors.records.clear()
            raise AssertionError(f"broker logged an error: {rec[0].getMessage()}") from (
                rec[0].exc_info[1] if rec[0].exc_info else None
            )
        if self.loop_errors:
            ctx = self.loop_errors[:]
            self.loop_errors.clear()
            raise AssertionError(f"asyncio exception handler: {ctx[0].get('message')}") from (
                ctx[0].get("exception")
            )
        FrameDecoder(max_frame=1 << 30).feed(bytes(transport.out))  # well-formed answers

    def close(self) -> None:
        for server in self.servers:
            self.loop.run_until_complete(server.stop())
        self.loop.close()
        self.tmp.cleanup()


_harness: DispatchHarness | None = None


def dispatch(data: bytes) -> None:
    global _harness
    if _harness is None:
        _harness = DispatchHarness()
    _harness(data)


def grpc5(data: bytes) -> None:
    from fuzz.grpc5 import grpc5 as target

    target(data)


def http2(data: bytes) -> None:
    from fuzz.http2 import http2 as target

    target(data)


TARGETS = {"codec": codec, "dispatch": dispatch, "grpc5": grpc5, "http2": http2}
