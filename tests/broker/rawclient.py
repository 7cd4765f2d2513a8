"""A small blocking remoting client over a plain socket, built on ``idemp.remoting``.

It reaches what the official C++ wheel cannot (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE,
QUERY/VIEW, raw PULL with chosen flags, LOCK_BATCH_MQ, bad input...). Every wait
has a deadline: ``request`` raises ``TimeoutError`` when no response with the
request's opaque arrives in time. Requests the broker pushes to us (for example
NOTIFY_CONSUMER_IDS_CHANGED) are kept in ``pushed``; responses that arrive for
another opaque are kept until asked for, so several requests may be in flight.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from idemp.remoting import (
    RPC_ONEWAY,
    BatchEntry,
    MessageExt,
    ProtocolError,
    RemotingCommand,
    RequestCode,
    SerializeType,
    decode_frame,
    decode_messages,
    encode,
    encode_batch,
    encode_properties,
)
from idemp.remoting.tags import tag_subscription

DEFAULT_TIMEOUT = 5.0
_opaques = itertools.count(1000)


class ConnectionClosed(ConnectionError):
    """The broker closed the connection while we waited."""


class RawClient:
    def __init__(
        self,
        addr: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        language: str = "JAVA",
        version: int = 409,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: the connection over TLS (the handshake done here)."""
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.timeout = timeout
        self.language = language
        self.version = version
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock)
        self._buf = bytearray()
        self.responses: dict[int, RemotingCommand] = {}
        # Every response frame's header exactly as sent (JSON headers only), and how
        # many responses each opaque got: the codec would hide non-string values.
        self.raw_headers: dict[int, dict[str, Any]] = {}
        self.response_counts: Counter[int] = Counter()
        self.pushed: list[RemotingCommand] = []
        self.closed_by_peer = False

    # --- life cycle ---------------------------------------------------------------
    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def local_addr(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    # --- low level ----------------------------------------------------------------
    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
        version: int | None = None,
        language: str | None = None,
        opaque: int | None = None,
    ) -> RemotingCommand:
        return RemotingCommand(
            code=code,
            opaque=next(_opaques) if opaque is None else opaque,
            flag=RPC_ONEWAY if oneway else 0,
            language=self.language if language is None else language,
            version=self.version if version is None else version,
            ext_fields={k: str(v) for k, v in (ext or {}).items()},
            body=body,
        )

    def _read_once(self, deadline: float) -> bool:
        """Read what is available before ``deadline``; False when nothing came."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        # TLS: a record already decrypted waits in the socket, not in the kernel
        pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0
        ready, _, _ = select.select([self.sock], [], [], 0 if pending else remaining)
        if not ready and not pending:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed_by_peer = True
            raise ConnectionClosed(f"{self.addr} closed the connection")
        self._buf += data
        while len(self._buf) >= 4:
            (length,) = struct.unpack_from(">i", self._buf, 0)
            if length < 4 or length > 64 << 20:
                raise ProtocolError(f"broker sent a frame of length {length}")
            if len(self._buf) < 4 + length:
                break
            frame = bytes(self._buf[4 : 4 + length])
            del self._buf[: 4 + length]
            cmd = decode_frame(frame)
            if cmd.is_response:
                self.responses[cmd.opaque] = cmd
                self.response_counts[cmd.opaque] += 1
                if cmd.serialize_type == SerializeType.JSON:
                    (packed,) = struct.unpack_from(">i", frame, 0)
                    self.raw_headers[cmd.opaque] = json.loads(frame[4 : 4 + (packed & 0xFFFFFF)])
            else:
                self.pushed.append(cmd)
        return True

    def wait_response(self, opaque: int, timeout: float | None = None) -> RemotingCommand:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while opaque not in self.responses:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no response for opaque {opaque} from {self.addr}")
            self._read_once(deadline)
        return self.responses.pop(opaque)

    def send(self, cmd: RemotingCommand) -> int:
        self.send_bytes(encode(cmd))
        return cmd.opaque

    def request(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
        **kw: Any,
    ) -> RemotingCommand:
        """Send a request and return the response with the same opaque."""
        cmd = self.command(code, ext, body, **kw)
        self.send(cmd)
        return self.wait_response(cmd.opaque, timeout)

    def oneway(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"") -> int:
        return self.send(self.command(code, ext, body, oneway=True))

    def collect(self, seconds: float) -> None:
        """Read everything that arrives for ``seconds`` (to prove that nothing does)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._read_once(deadline)

    def wait_pushed(
        self, predicate: Callable[[RemotingCommand], bool], timeout: float
    ) -> RemotingCommand:
        """The first broker-initiated request matching ``predicate`` (consumed)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, cmd in enumerate(self.pushed):
                if predicate(cmd):
                    return self.pushed.pop(i)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no matching request pushed by {self.addr} in {timeout}s")
            self._read_once(deadline)

    def wait_closed(self, timeout: float) -> bool:
        """True if the peer closes the connection within ``timeout`` (data is discarded)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._read_once(deadline)
        except (ConnectionClosed, ProtocolError):
            return True
        except OSError:
            return True
        return False

    # --- protocol helpers -----------------------------------------------------------
    def send_message(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str] | None = None,
        *,
        queue_id: int = 0,
        group: str = "RawProducerGroup",
        code: int = RequestCode.SEND_MESSAGE,
        sys_flag: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> RemotingCommand:
        ext: dict[str, Any] = {
            "producerGroup": group,
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": queue_id,
            "sysFlag": sys_flag,
            "bornTimestamp": int(time.time() * 1000),
            "flag": 0,
            "properties": encode_properties(properties or {}),
            "reconsumeTimes": 0,
            "unitMode": "false",
        }
        ext.update(extra or {})
        return self.request(code, ext, body)

    def create_topic(
        self, topic: str, queues: int = 1, perm: int = 6, attributes: str = ""
    ) -> RemotingCommand:
        """``attributes``: RocketMQ 5's form, as mqadmin 5 sends it (``+message.type=FIFO``)."""
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
        }
        if attributes:
            ext["attributes"] = attributes
        return self.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    def create_group(self, group: str, **fields: Any) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with the config's JSON fields
        (``consumeMessageOrderly=True``, ``retryMaxTimes=1``, ...)."""
        body = json.dumps({"groupName": group, **fields}).encode()
        return self.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)

    def update_broker_config(self, **values: object) -> RemotingCommand:
        """UPDATE_BROKER_CONFIG, as ``mqadmin updateBrokerConfig -k KEY -v VALUE`` sends it."""
        body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
        return self.request(RequestCode.UPDATE_BROKER_CONFIG, {}, body)

    def view(self, commit_log_offset: int) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the record at a commit log offset, whatever its topic."""
        resp = self.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": commit_log_offset})
        assert resp.code == 0, resp
        (msg,) = decode_messages(resp.body)
        return msg

    def topic_names(self) -> set[str]:
        """The broker's topic table (GET_ALL_TOPIC_CONFIG)."""
        resp = self.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
        assert resp.code == 0, resp
        return set(json.loads(resp.body)["topicConfigTable"])

    def max_offset(self, topic: str, queue_id: int = 0) -> int:
        resp = self.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        assert resp.code == 0, resp
        return int(resp.ext_fields["offset"])

    def indexed(
        self, topic: str, queue_id: int | Sequence[int], count: int, within: float = 10.0
    ) -> int:
        """The queue's max offset (the sum over several queues) once it reaches ``count``,
        or after ``within`` seconds. RocketMQ puts a stored message in its consume queue a
        moment after it answered the send (its reput thread); idemp's broker before. A
        pull or max offset right after a send needs this on RocketMQ."""
        queues = [queue_id] if isinstance(queue_id, int) else list(queue_id)
        deadline = time.monotonic() + within
        while (held := sum(self.max_offset(topic, q) for q in queues)) < count:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)  # polled, bounded by ``within``
        return held

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str = "RawConsumerGroup",
        max_nums: int = 32,
        sys_flag: int = 4,
        subscription: str = "*",
        suspend_ms: int = 15000,
        commit_offset: int = 0,
        sub_version: int = 0,
        expression_type: str | None = None,
        timeout: float | None = None,
    ) -> RemotingCommand:
        ext: dict[str, Any] = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": sys_flag,
            "commitOffset": commit_offset,
            "suspendTimeoutMillis": suspend_ms,
            "subscription": subscription,
            "subVersion": sub_version,
        }
        if expression_type is not None:
            ext["expressionType"] = expression_type
        return self.request(RequestCode.PULL_MESSAGE, ext, timeout=timeout)

    def pull_messages(self, topic: str, queue_id: int = 0, offset: int = 0) -> list[MessageExt]:
        """Every message of a queue from ``offset`` (non-suspending pulls)."""
        out: list[MessageExt] = []
        while True:
            resp = self.pull(topic, queue_id, offset, sys_flag=4)
            if resp.code != 0:
                return out
            msgs = decode_messages(resp.body)
            out += msgs
            offset = int(resp.ext_fields["nextBeginOffset"])

    def heartbeat(
        self,
        client_id: str,
        consumer_groups: Sequence[str] = (),
        producer_groups: Sequence[str] = (),
        topic: str = "T",
        sub_version: int = 1,
        sub_string: str = "*",
        expression_type: str = "TAG",
        code_set: Sequence[int] | None = None,
        unit_mode: bool = False,
    ) -> RemotingCommand:
        """The subscription's tagsSet and codeSet as the Java client's FilterAPI builds
        them from ``sub_string`` (the broker filters by the codes), or ``code_set``."""
        parsed = tag_subscription(sub_string) if expression_type == "TAG" else None
        tags = sorted(parsed[0]) if parsed else []
        codes = list(code_set) if code_set is not None else sorted(parsed[1]) if parsed else []
        body = {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": g,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "unitMode": unit_mode,
                    "subscriptionDataSet": [
                        {
                            "topic": topic,
                            "subString": sub_string,
                            "tagsSet": tags,
                            "codeSet": codes,
                            "subVersion": sub_version,
                            "classFilterMode": False,
                            "expressionType": expression_type,
                        }
                    ],
                }
                for g in consumer_groups
            ],
            "producerDataSet": [{"groupName": g} for g in producer_groups],
        }
        return self.request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())


def json_frame(
    header: dict[str, Any], body: bytes = b"", *, header_bytes: bytes | None = None
) -> bytes:
    """A frame with a hand-made JSON header (numbers in extFields, missing fields...)."""
    raw = header_bytes if header_bytes is not None else json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body


def batch_body(entries: list[tuple[bytes, dict[str, str]]]) -> bytes:
    return encode_batch(BatchEntry(body=b, properties=p) for b, p in entries)
