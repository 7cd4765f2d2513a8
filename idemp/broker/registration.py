"""REGISTER_BROKER's body (RocketMQ's RegisterBrokerBody), both ways; pure.

Plain, it is the JSON of ``{"filterServerList": [...], "topicConfigSerializeWrapper":
{"dataVersion": {...}, "topicConfigTable": {...}}}``. With ``compressedRegister`` the
broker deflates a binary form instead: length-prefixed (big-endian int32) data version
JSON, a topic count, each topic as TopicConfig.encode's five space-separated fields (no
``topicSysFlag``: it does not survive), then the filter server list's JSON.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from idemp.remoting.codes import Perm

_INT = struct.Struct(">i")


class RegisterBodyError(ValueError):
    pass


def registered_perm(broker_permission: int, topic_perm: int) -> int:
    """The perm a topic is registered (and routed) with: its own while the broker is
    read-write, else the broker's (BrokerController.registerBrokerAll and
    registerIncrementBrokerData), whatever bits either holds."""
    rw = Perm.READ | Perm.WRITE
    return topic_perm if broker_permission & rw == rw else broker_permission


def body_crc32(body: bytes) -> int:
    """UtilAll.crc32: CRC32 masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def decode_register_body(
    body: bytes, compressed: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The topic configs by name and the topic table's data version."""
    topics: dict[str, dict[str, Any]]
    if not compressed:
        try:
            raw = json.loads(body)
            wrapper = raw.get("topicConfigSerializeWrapper") or {}
            topics = dict(wrapper.get("topicConfigTable") or {})
            version = dict(wrapper.get("dataVersion") or {})
        except (ValueError, AttributeError, TypeError) as exc:
            raise RegisterBodyError(f"Failed to decode RegisterBrokerBody: {exc}") from exc
        return {str(k): dict(v) for k, v in topics.items()}, version
    try:
        data = zlib.decompress(body)
        pos = 0

        def chunk() -> bytes:
            nonlocal pos
            (n,) = _INT.unpack_from(data, pos)
            pos += 4
            if n < 0 or pos + n > len(data):
                raise RegisterBodyError("Failed to decode RegisterBrokerBody: truncated")
            out = data[pos : pos + n]
            pos += n
            return out

        version = dict(json.loads(chunk()))
        (count,) = _INT.unpack_from(data, pos)
        pos += 4
        topics = {}
        for _ in range(count):
            fields = chunk().decode("utf-8").split(" ")
            if len(fields) != 5:
                continue  # TopicConfig.decode leaves the config empty
            name, read, write, perm, filter_type = fields
            topics[name] = {
                "topicName": name,
                "readQueueNums": int(read),
                "writeQueueNums": int(write),
                "perm": int(perm),
                "topicFilterType": filter_type,
                "topicSysFlag": 0,
            }
    except (zlib.error, struct.error, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, RegisterBodyError):
            raise
        raise RegisterBodyError(f"Failed to decode RegisterBrokerBody: {exc}") from exc
    return topics, version


def encode_register_body(
    topics: dict[str, dict[str, Any]], version: dict[str, Any], compressed: bool = False
) -> bytes:
    if not compressed:
        body = {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {"dataVersion": version, "topicConfigTable": topics},
        }
        return json.dumps(body, separators=(",", ":")).encode()
    parts = [_prefixed(json.dumps(version, separators=(",", ":")).encode())]
    parts.append(_INT.pack(len(topics)))
    for name, cfg in topics.items():
        text = (
            f"{name} {cfg['readQueueNums']} {cfg['writeQueueNums']} {cfg['perm']} "
            f"{cfg.get('topicFilterType', 'SINGLE_TAG')}"
        )
        parts.append(_prefixed(text.encode()))
    parts.append(_prefixed(b"[]"))
    return zlib.compress(b"".join(parts), 9)


def _prefixed(data: bytes) -> bytes:
    return _INT.pack(len(data)) + data
