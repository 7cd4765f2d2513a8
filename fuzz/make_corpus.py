"""Write the seed corpus: every golden frame (from tests/remoting/data/golden_frames.jsonl)
as a codec input (whole frame, header, body as messages/properties/JSON) and as a
dispatch input (the raw frame, mode byte 0)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "tests/remoting/data/golden_frames.jsonl"


def _put(directory: Path, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"seed-{hashlib.sha1(data).hexdigest()[:16]}").write_bytes(data)


def main() -> None:
    for line in GOLDEN.read_text(encoding="utf-8").splitlines():
        f = json.loads(line)
        header = f["header_raw"].encode("utf-8")
        body = bytes.fromhex(f["body_hex"] or "")
        frame = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
        _put(HERE / "corpus/codec", b"\x00" + frame)
        _put(HERE / "corpus/codec", b"\x05" + header)
        if body:
            for mode in (1, 2, 4):
                _put(HERE / "corpus/codec", bytes([mode]) + body)
        props = (f["header"].get("extFields") or {}).get("properties")
        if props:
            _put(HERE / "corpus/codec", b"\x03" + props.encode("utf-8"))
        if "->broker" in f["direction"] or "->namesrv" in f["direction"]:
            _put(HERE / "corpus/dispatch", b"\x00" + frame)
    from fuzz.grpc5 import seed_requests

    for request in seed_requests():
        _put(HERE / "corpus/grpc5", request)
    from fuzz.http2 import seed_streams

    for stream in seed_streams():
        _put(HERE / "corpus/http2", stream)


if __name__ == "__main__":
    main()
