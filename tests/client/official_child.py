"""The official client (rocketmq-client-python 0.5.0rc2, C++ inside) as a child process.

    python official_child.py produce NAMESRV TOPIC COUNT KEYS
    python official_child.py consume NAMESRV TOPIC GROUP COUNT OUTFILE

``produce`` sends message i orderly with sharding key ``key-<i mod KEYS>`` and body
``"<i> "``; ``consume`` runs an orderly PushConsumer and writes one JSON line per
message (queue, offset, keys, index) until COUNT messages arrived. A child process,
because the C++ client keeps per-process state (one client id, one factory).
"""

from __future__ import annotations

import json
import sys
import threading
import time


def produce(namesrv: str, topic: str, count: int, keys: int) -> int:
    from rocketmq.client import Message, Producer

    p = Producer("official-orderly-producer")
    p.set_namesrv_addr(namesrv)
    p.start()
    try:
        for i in range(count):
            key = f"key-{i % keys}"
            msg = Message(topic)
            msg.set_keys(key)
            msg.set_body(f"{i} official".encode())
            for attempt in range(20):
                try:
                    p.send_orderly_with_sharding_key(msg, key)
                    break
                except Exception as exc:  # the first send may race the route fetch
                    if "No route info" not in str(exc) or attempt == 19:
                        raise
                    time.sleep(0.2)
    finally:
        p.shutdown()
    print(json.dumps({"sent": count}))
    return 0


def consume(namesrv: str, topic: str, group: str, count: int, out_path: str) -> int:
    from rocketmq.client import ConsumeStatus, PushConsumer

    done = threading.Event()
    lock = threading.Lock()
    seen = [0]
    out = open(out_path, "a", encoding="utf-8")

    def callback(msg: object) -> object:
        try:
            body = bytes(msg.body)  # type: ignore[attr-defined]
            line = json.dumps(
                {
                    "queue": msg.queue_id,  # type: ignore[attr-defined]
                    "offset": msg.queue_offset,  # type: ignore[attr-defined]
                    "keys": [msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys],  # type: ignore[attr-defined]
                    "index": int(body.split(b" ", 1)[0]),
                    "time": time.time(),
                }
            )
            with lock:
                out.write(line + "\n")
                out.flush()
                seen[0] += 1
                if seen[0] >= count:
                    done.set()
            return ConsumeStatus.CONSUME_SUCCESS
        except Exception:  # never let the ctypes callback raise (it would ack)
            return ConsumeStatus.RECONSUME_LATER

    c = PushConsumer(group, orderly=True)
    c.set_namesrv_addr(namesrv)
    c.subscribe(topic, callback)
    c.start()
    print(json.dumps({"event": "started"}), flush=True)
    ok = done.wait(90)
    c.shutdown()
    out.close()
    return 0 if ok else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "produce":
        sys.exit(produce(a[1], a[2], int(a[3]), int(a[4])))
    sys.exit(consume(a[1], a[2], a[3], int(a[4]), a[5]))
