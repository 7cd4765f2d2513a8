"""RemotingCommand and its two header serializations (JSON and ROCKETMQ binary).

Sans-IO: this module turns commands into bytes and bytes into commands; it never
touches a socket. Input is read leniently (the C++ client sends numbers and "0"/"1"
inside extFields and a trailing newline after the JSON header); output is strict
(every extFields value is a JSON string, which is all the C++ client can read).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from .codes import RPC_ONEWAY, RPC_TYPE_RESPONSE, LanguageCode, SerializeType
from .javaparse import parse_java_int

_LANG_BY_NAME = {c.name: int(c) for c in LanguageCode}
_LANG_BY_CODE = {int(c): c.name for c in LanguageCode}

# Version ordinal written by idemp when it speaks as a broker: RocketMQ V4_9_7.
BROKER_VERSION = 407


class ProtocolError(ValueError):
    """The peer sent bytes that are not a valid remoting frame or header."""


@dataclass(slots=True)
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "JAVA"
    version: int = BROKER_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    def response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """A response to this request: same opaque, same serialization, flag bit 0."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=RPC_TYPE_RESPONSE,
            remark=remark,
            ext_fields=ext_fields if ext_fields is not None else {},
            body=body,
            serialize_type=self.serialize_type,
        )

    def field_str(self, name: str, default: str | None = None) -> str | None:
        return self.ext_fields.get(name, default)

    def field_int(self, name: str, default: int | None = None, bits: int = 64) -> int:
        """Read an integer header field as Java parses it (``bits``: int or long),
        naming the field when it is absent or invalid."""
        raw = self.ext_fields.get(name)
        if raw is None or raw == "":
            if default is None:
                raise HeaderFieldError(f"the custom field <{name}> is null")
            return default
        value = parse_java_int(raw, bits)
        if value is None:
            raise HeaderFieldError(f"the custom field <{name}> is not an integer: {raw!r}")
        return value

    def field_bool(self, name: str, default: bool = False) -> bool:
        """Booleans arrive as "true"/"false" (Java) or "1"/"0" (C++)."""
        raw = self.ext_fields.get(name)
        if raw is None or raw == "":
            return default
        return raw.strip().lower() in ("true", "1")

    def require(self, *names: str) -> None:
        for name in names:
            if self.ext_fields.get(name) is None:
                raise HeaderFieldError(f"the custom field <{name}> is null")


class HeaderFieldError(ProtocolError):
    """A required header field is missing or malformed (Java: RemotingCommandException)."""


def _ext_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


# --- JSON header -----------------------------------------------------------------


def encode_json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": cmd.code,
        "extFields": {k: _ext_value(v) for k, v in cmd.ext_fields.items()},
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = cmd.version
    # A lone surrogate (a JSON request may carry "\ud800") cannot be UTF-8: written back
    # as the same JSON escape, it stays the same string for the peer instead of failing.
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


def _as_int(obj: dict[str, Any], name: str, default: int) -> int:
    """A header number as fastjson reads it into Java's int: absent or null is the
    default, true/false 1/0, a fraction truncated, a numeric string parsed; anything
    else, or a number beyond 32 bits, is a frame the peer cannot have meant."""
    value = obj.get(name, default)
    if value is None:
        return default
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    elif not isinstance(value, (int, str)):
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ProtocolError(f"header field {name!r} is not an integer: {value!r}") from None
    if not -(2**31) <= number < 2**31:
        raise ProtocolError(f"header field {name!r} is beyond 32 bits: {value!r}")
    return number


def decode_json_header(data: bytes | memoryview) -> RemotingCommand:
    try:
        # bytes that are not UTF-8 are replaced, not refused, as fastjson reads them
        obj = json.loads(bytes(data).decode("utf-8", "replace"))
    except (ValueError, RecursionError) as exc:
        # RecursionError: a deeply nested header (e.g. "[[[[...") is the peer's fault too.
        raise ProtocolError(f"invalid JSON header: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("JSON header is not an object")
    # No code is code 0 (RocketMQ answers "request type 0 not supported"); a language
    # number must be one of LanguageCode's, a name need not be (fastjson: null).
    language = obj.get("language", "JAVA")
    if language is None:
        language = "JAVA"
    elif isinstance(language, int) and not isinstance(language, bool):
        if language not in _LANG_BY_CODE:
            raise ProtocolError(f"header field 'language' is no LanguageCode: {language!r}")
        language = _LANG_BY_CODE[language]
    elif not isinstance(language, str):
        raise ProtocolError(f"header field 'language' is invalid: {language!r}")
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        remark = str(remark)
    raw_ext = obj.get("extFields")
    ext: dict[str, str] = {}
    if raw_ext is not None:
        if not isinstance(raw_ext, dict):
            raise ProtocolError("header field 'extFields' is not an object")
        for k, v in raw_ext.items():
            if v is not None:
                ext[str(k)] = _ext_value(v)
    return RemotingCommand(
        code=_as_int(obj, "code", 0),
        opaque=_as_int(obj, "opaque", 0),
        flag=_as_int(obj, "flag", 0),
        language=language,
        version=_as_int(obj, "version", 0),
        remark=remark,
        ext_fields=ext,
        serialize_type=SerializeType.JSON,
    )


# --- ROCKETMQ binary header (RocketMQSerializable) -----------------------------------

_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = _LANG_BY_NAME.get(cmd.language, int(LanguageCode.OTHER))
    parts = [_BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)]
    if cmd.remark:
        remark = cmd.remark.encode("utf-8")
        parts.append(struct.pack(">i", len(remark)) + remark)
    else:
        parts.append(b"\x00\x00\x00\x00")
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb = k.encode("utf-8")
        vb = _ext_value(v).encode("utf-8")
        ext += struct.pack(">h", len(kb)) + kb + struct.pack(">i", len(vb)) + vb
    parts.append(struct.pack(">i", len(ext)) + bytes(ext))
    return b"".join(parts)


def decode_binary_header(data: bytes | memoryview) -> RemotingCommand:
    buf = bytes(data)
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(buf, 0)
        pos = _BIN_FIXED.size
        (remark_len,) = struct.unpack_from(">i", buf, pos)
        pos += 4
        if remark_len < 0 or pos + remark_len > len(buf):
            raise ProtocolError(f"binary header remark length {remark_len} out of range")
        remark = buf[pos : pos + remark_len].decode("utf-8") if remark_len else None
        pos += remark_len
        (ext_len,) = struct.unpack_from(">i", buf, pos)
        pos += 4
        if ext_len < 0 or pos + ext_len > len(buf):
            raise ProtocolError(f"binary header extFields length {ext_len} out of range")
        end = pos + ext_len
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", buf, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise ProtocolError("binary header key length out of range")
            key = buf[pos : pos + klen].decode("utf-8")
            pos += klen
            (vlen,) = struct.unpack_from(">i", buf, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise ProtocolError("binary header value length out of range")
            ext[key] = buf[pos : pos + vlen].decode("utf-8")
            pos += vlen
    except struct.error as exc:
        raise ProtocolError(f"truncated binary header: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"binary header is not UTF-8: {exc}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        language=_LANG_BY_CODE.get(lang, "OTHER"),
        version=version,
        remark=remark,
        ext_fields=ext,
        serialize_type=SerializeType.ROCKETMQ,
    )
