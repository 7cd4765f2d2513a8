"""idemp.remoting: the RocketMQ remoting protocol as a sans-IO codec.

Bytes in, commands out, and back. Nothing here opens a socket or imports any other
part of idemp, so the broker and the client share it and it can be fuzzed alone.
"""

from .codes import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    LanguageCode,
    MessageSysFlag,
    Perm,
    Prop,
    PullSysFlag,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from .command import HeaderFieldError, ProtocolError, RemotingCommand
from .framing import DEFAULT_MAX_FRAME, FrameDecoder, FrameTooLarge, decode_frame, encode
from .message import (
    BatchEntry,
    MessageExt,
    MessageFormatError,
    decode_batch,
    decode_message,
    decode_messages,
    decode_properties,
    encode_batch,
    encode_message,
    encode_properties,
)
from .msgid import UniqKeyGenerator, offset_msg_id, parse_offset_msg_id
from .tags import java_string_hash, parse_subscription, tags_code

__all__ = [
    "DEFAULT_MAX_FRAME",
    "RPC_ONEWAY",
    "RPC_TYPE_RESPONSE",
    "BatchEntry",
    "FrameDecoder",
    "FrameTooLarge",
    "HeaderFieldError",
    "LanguageCode",
    "MessageExt",
    "MessageFormatError",
    "MessageSysFlag",
    "Perm",
    "Prop",
    "ProtocolError",
    "PullSysFlag",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "UniqKeyGenerator",
    "decode_batch",
    "decode_frame",
    "decode_message",
    "decode_messages",
    "decode_properties",
    "encode",
    "encode_batch",
    "encode_message",
    "encode_properties",
    "java_string_hash",
    "offset_msg_id",
    "parse_offset_msg_id",
    "parse_subscription",
    "tags_code",
]
