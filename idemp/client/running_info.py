"""A consumer's answer to GET_CONSUMER_RUNNING_INFO, in the shape of RocketMQ's Java
``ConsumerRunningInfo``: what ``mqadmin consumerStatus`` and RocketMQ's dashboard parse.

fastjson writes the queue table as a map keyed by MessageQueue objects, which Java's
tools expect (a list there fails in their parser), and reads the consumer's type, order
and start time from ``properties`` under the ``PROP_*`` names. idemp keeps no per-topic
pull and consume rates, so ``statusTable`` is empty rather than made of zeros.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import Any

from idemp.remoting.jsonlenient import ObjectKeyMap, dumps, mq

from .processqueue import ProcessQueue
from .route import MessageQueue

PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"


def epoch_ms(monotonic: float) -> int:
    """A ``time.monotonic()`` reading as wall-clock milliseconds."""
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)


def queue_table(
    queues: Iterable[tuple[MessageQueue, ProcessQueue, int | None]],
) -> ObjectKeyMap:
    """``mqTable``: each queue's ProcessQueueInfo (``ProcessQueue.fillProcessQueueInfo``)."""
    table = ObjectKeyMap()
    for queue, pq, commit_offset in queues:
        cached = sorted([*pq.cached_offsets(), *pq.consuming])
        table.append(
            (
                mq(queue.topic, queue.broker_name, queue.queue_id),
                {
                    "commitOffset": -1 if commit_offset is None else commit_offset,
                    "cachedMsgMinOffset": cached[0] if cached else 0,
                    "cachedMsgMaxOffset": cached[-1] if cached else 0,
                    "cachedMsgCount": len(cached),
                    "cachedMsgSizeInMiB": pq.msg_size // (1024 * 1024),
                    "transactionMsgMinOffset": min(pq.consuming, default=0),
                    "transactionMsgMaxOffset": max(pq.consuming, default=0),
                    "transactionMsgCount": len(pq.consuming),
                    "locked": pq.locked,
                    "tryUnlockTimes": 0,
                    "lastLockTimestamp": epoch_ms(pq.last_lock_time) if pq.last_lock_time else 0,
                    "droped": pq.dropped,
                    "lastPullTimestamp": epoch_ms(pq.last_pull_time),
                    "lastConsumeTimestamp": epoch_ms(pq.last_consume_time),
                },
            )
        )
    return table


def python_stacks() -> str:
    """What ``jstack`` gives a Java consumer: every thread's stack, here Python's."""
    names = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        name = thread.name if thread is not None else str(ident)
        daemon = " daemon" if thread is not None and thread.daemon else ""
        out.append(f'"{name}"{daemon}\n' + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def encode(info: dict[str, Any], namesrv: str, version: str, jstack: bool) -> bytes:
    """The body: the consumer's own part plus what Java's client instance adds."""
    body = dict(info)
    body["properties"] = {
        **info["properties"],
        PROP_NAMESERVER_ADDR: namesrv,
        PROP_CONSUME_TYPE: "CONSUME_PASSIVELY",
        PROP_CLIENT_VERSION: version,
    }
    if jstack:
        body["jstack"] = python_stacks()
    return dumps(body).encode()
