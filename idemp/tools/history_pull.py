"""``idemp history pull``: a live cluster's message history, for reconciliation.

Pulls the given topics (plus ``%RETRY%<group>`` and ``%DLQ%<group>`` of each named
group) from every queue's master over an offset range (all of ``GET_MIN_OFFSET`` ..
``GET_MAX_OFFSET`` as read at start) or a time range (``SEARCH_OFFSET_BY_TIMESTAMP``,
then rows filtered by store time), and writes the rows of ``idemp broker export``
(``idemp.history``), so reconciliation reads a real RocketMQ cluster as it reads
idemp's store.

It touches no consumer group's state: plain PULL_MESSAGE without COMMIT_OFFSET or
SUSPEND, under a group of its own (``--pull-group``), with the subscription in the
request (no heartbeat, so the broker knows no consumer of any group), and no offset
updates.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from idemp.client.instance import ClientInstance
from idemp.client.route import MessageQueue
from idemp.client.settings import ClientSettings
from idemp.client.transport import ResponseError
from idemp.history import row_of, write_rows
from idemp.remoting import MessageExt, PullSysFlag, RequestCode, ResponseCode, decode_messages
from idemp.remoting.codes import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from idemp.remoting.jsonlenient import loads_fastjson

DEFAULT_PULL_GROUP = "idemp_history_pull"  # also in tools/history.py
PULL_BATCH = 32
# SEARCH_OFFSET_BY_TIMESTAMP answers the entry *nearest* in time, and entries may
# share a millisecond: start this many entries earlier (end this many later) and
# filter by store time, so no entry at a range edge is missed.
SEARCH_MARGIN = 32


class HistoryError(Exception):
    pass


@dataclass(frozen=True)
class TimeRange:
    begin_ms: int | None = None  # inclusive
    end_ms: int | None = None  # exclusive

    def contains(self, ts: int) -> bool:
        return (self.begin_ms is None or ts >= self.begin_ms) and (
            self.end_ms is None or ts < self.end_ms
        )


def history_topics(topics: list[str], groups: list[str]) -> list[tuple[str, bool]]:
    """(topic, required): retry and DLQ topics exist only once a group needed them."""
    out = [(t, True) for t in topics]
    for g in groups:
        out += [(RETRY_GROUP_TOPIC_PREFIX + g, False), (DLQ_GROUP_TOPIC_PREFIX + g, False)]
    return out


class HistoryPuller:
    """Blocking facade over a client instance of its own (no producer or consumer is
    registered in it, so it never heartbeats)."""

    def __init__(
        self, namesrv_addr: str, pull_group: str = DEFAULT_PULL_GROUP, timeout: float = 10.0
    ) -> None:
        self.pull_group = pull_group
        self.timeout = timeout
        self.instance = ClientInstance.acquire(
            ClientSettings(
                namesrv_addr=namesrv_addr, instance_name="idemp-history", request_timeout=timeout
            )
        )

    def close(self) -> None:
        self.instance.release()

    def __enter__(self) -> HistoryPuller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Any) -> Any:
        return self.instance.loop_thread.call(coro, self.timeout * 3)

    def _addr(self, mq: MessageQueue) -> str:
        addr = self.instance.master_addr(mq.broker_name)
        if addr is None:
            raise HistoryError(f"no master address for broker {mq.broker_name}")
        return addr

    def _request(self, mq: MessageQueue, code: int, ext: dict[str, str]) -> Any:
        return self._call(self.instance.broker_call(self._addr(mq), code, ext))

    def queues(self, topic: str) -> list[MessageQueue] | None:
        """Every queue of ``topic`` (readable or not: a write-only topic is an error
        at pull time, not an empty history); None if the topic does not exist."""
        route = self._call(self.instance.update_route(topic))
        if route is None:
            return None
        return sorted(
            MessageQueue(topic, str(qd.get("brokerName")), i)
            for qd in route.queue_datas
            for i in range(int(qd.get("readQueueNums", 0)))
        )

    def consumer_model(self, mq: MessageQueue, group: str) -> str | None:
        """The message model (CLUSTERING, BROADCASTING) ``group``'s online consumers
        registered at ``mq``'s broker; None when none is online there."""
        resp = self._request(mq, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return None
        model = loads_fastjson(resp.body).get("messageModel")
        return str(model) if model else None

    def queue_offset(self, mq: MessageQueue, code: int, timestamp: int | None = None) -> int:
        ext = {"topic": mq.topic, "queueId": str(mq.queue_id)}
        if timestamp is not None:
            ext["timestamp"] = str(timestamp)
        resp = self._request(mq, code, ext)
        if resp.code != ResponseCode.SUCCESS:
            raise ResponseError(resp.code, resp.remark, f"offset of {mq}")
        return int(resp.ext_fields.get("offset", "0"))

    def offset_range(self, mq: MessageQueue, when: TimeRange) -> tuple[int, int]:
        lo = self.queue_offset(mq, RequestCode.GET_MIN_OFFSET)
        hi = self.queue_offset(mq, RequestCode.GET_MAX_OFFSET)
        if hi <= lo:
            return lo, lo
        start, stop = lo, hi
        if when.begin_ms is not None:
            found = self.queue_offset(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, when.begin_ms)
            start = max(lo, found - SEARCH_MARGIN)
        if when.end_ms is not None:
            found = self.queue_offset(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, when.end_ms)
            stop = min(hi, found + 1 + SEARCH_MARGIN)
        return start, max(start, stop)

    def pull(
        self, mq: MessageQueue, start: int, stop: int, *, decompress: bool = False
    ) -> Iterator[MessageExt]:
        """The records at queue offsets [start, stop), as stored (bodies decompressed
        only if asked), without committing, suspending or heartbeating."""
        offset = start
        while offset < stop:
            ext = {
                "consumerGroup": self.pull_group,
                "topic": mq.topic,
                "queueId": str(mq.queue_id),
                "queueOffset": str(offset),
                "maxMsgNums": str(min(PULL_BATCH, stop - offset)),
                "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)),
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            }
            resp = self._request(mq, RequestCode.PULL_MESSAGE, ext)
            nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
            if resp.code == ResponseCode.SUCCESS:
                for msg in decode_messages(resp.body, decompress=decompress):
                    if start <= msg.queue_offset < stop:
                        yield msg
            elif resp.code == ResponseCode.PULL_NOT_FOUND:
                return  # the queue ends here (it shrank, or max was read earlier)
            elif resp.code == ResponseCode.NO_PERMISSION:
                raise HistoryError(
                    f"{mq.topic} is not readable ({resp.remark}); RocketMQ creates %DLQ% "
                    f"topics write-only: mqadmin updateTopicPerm -t {mq.topic} -p 6"
                )
            elif resp.code not in (
                ResponseCode.PULL_RETRY_IMMEDIATELY,
                ResponseCode.PULL_OFFSET_MOVED,
            ):
                raise ResponseError(resp.code, resp.remark, f"pull of {mq} at {offset}")
            if nxt <= offset:
                return  # OFFSET_MOVED backwards (offset past max): nothing more here
            offset = nxt

    def rows(
        self,
        topics: list[str],
        groups: list[str],
        when: TimeRange = TimeRange(),
        with_body: bool = False,
    ) -> Iterator[dict[str, Any]]:
        for topic, required in history_topics(topics, groups):
            queues = self.queues(topic)
            if queues is None:
                if required:
                    raise HistoryError(f"topic {topic} does not exist")
                continue
            for mq in queues:
                start, stop = self.offset_range(mq, when)
                for msg in self.pull(mq, start, stop):
                    if when.contains(msg.store_timestamp):
                        yield row_of(msg, with_body, mq.broker_name)


def pull_history(
    namesrv_addr: str,
    topics: list[str],
    groups: list[str],
    out: str,
    *,
    when: TimeRange = TimeRange(),
    fmt: str | None = None,
    with_body: bool = False,
    pull_group: str = DEFAULT_PULL_GROUP,
) -> int:
    """Write the history of ``topics`` (and the groups' retry/DLQ topics); return
    the number of rows."""
    with HistoryPuller(namesrv_addr, pull_group) as puller:
        return write_rows(puller.rows(topics, groups, when, with_body), out, fmt)
