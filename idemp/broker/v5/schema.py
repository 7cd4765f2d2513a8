"""The protobuf classes of RocketMQ 5's gRPC protocol, compiled from ``messaging.proto``.

grpcio-tools compiles the file when this module is first imported (``grpc.protos``), so
no generated code is kept in the repository or built at install time.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

SERVICE = "apache.rocketmq.v2.MessagingService"

_PROTO = Path(__file__).with_name("messaging.proto")
_ROOT = _PROTO.parents[3]  # the folder holding the idemp package


def _compile() -> Any:
    # grpcio-tools looks for the file (and imports the module it builds) along sys.path;
    # an editable install does not put the source folder there, so it goes in for the call
    root = str(_ROOT)
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        return grpc.protos(str(_PROTO.relative_to(_ROOT)))
    finally:
        if added:
            sys.path.remove(root)


pb: Any = _compile()
Code: Any = pb.Code


def status(code: int, message: str | None = None) -> Any:
    return pb.Status(code=code, message=message if message is not None else Code.Name(code))
