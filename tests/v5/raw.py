"""Raw gRPC calls to a RocketMQ 5 endpoint, with idemp's own protobuf classes: requests
no official client would send (malformed, forged, over the limits)."""

from __future__ import annotations

from typing import Any

import grpc

from idemp.broker.v5.schema import SERVICE, pb

METADATA = (
    ("x-mq-client-id", "raw-client@test"),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
    ("x-mq-client-version", "5.1.2"),
)


class Raw:
    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)

    def close(self) -> None:
        self.channel.close()

    def unary(self, method: str, request: Any, response: Any, *, metadata: Any = METADATA) -> Any:
        call = self.channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=_bytes_of,
            response_deserializer=response.FromString,
        )
        return call(request, metadata=metadata, timeout=30)

    def stream(self, method: str, request: Any, response: Any) -> list[Any]:
        call = self.channel.unary_stream(
            f"/{SERVICE}/{method}",
            request_serializer=_bytes_of,
            response_deserializer=response.FromString,
        )
        return list(call(request, metadata=METADATA, timeout=40))


def _bytes_of(request: Any) -> bytes:
    return request if isinstance(request, bytes) else bytes(request.SerializeToString())


def resource(name: str) -> Any:
    return pb.Resource(name=name)
