"""MessageStore: the commit log, its consume queues and the metadata tables.

Everything runs on the broker's event loop; only fsync is pushed to a thread. A put
is: choose the queue (delay levels redirect to SCHEDULE_TOPIC_XXXX), encode the
record at the log's end, append, index, and tell whoever waits on that queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from idemp.history import is_visible
from idemp.remoting.codes import SCHEDULE_TOPIC, TIMER_TOPIC, MessageSysFlag, Prop
from idemp.remoting.javaparse import java_int
from idemp.remoting.message import MessageExt, decode_message, encode_message
from idemp.remoting.tags import tags_code
from idemp.waiting import within

from .brokerstats import BrokerStats
from .commitlog import CommitLog
from .config import BrokerConfig
from .consumequeue import ConsumeQueue
from .diskguard import DiskGuard
from .jsonfile import read_json, write_json
from .metadata import GroupTable, OffsetTable, TopicTable

DELETED_TOPICS = "deletedTopics.json"
# RocketMQ 5's timer messages (a delivery time to the millisecond, not a delay level)
# wait in this topic; its consume queue's tags code is the delivery time.
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
# what RocketMQ 5's timer wheel writes into a timer message: its slot when parked, the
# wheel's time (whole seconds) when it entered, and when it was delivered
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_PRECISION_MS = 1000  # timerPrecisionMs


def timer_slot(deliver_ms: int) -> int:
    """HookUtils.transformTimerMessage: the delivery time down to the wheel's precision
    (a time on a slot's edge belongs to the slot before)."""
    if deliver_ms % TIMER_PRECISION_MS == 0:
        return deliver_ms - TIMER_PRECISION_MS
    return deliver_ms // TIMER_PRECISION_MS * TIMER_PRECISION_MS


log = logging.getLogger("idemp.broker.store")

# RocketMQ scans at most 16000 bytes of consume queue (800 entries) per pull.
MAX_FILTER_SCAN = 800


class GetStatus(Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"


@dataclass(slots=True)
class PutResult:
    commit_log_offset: int
    queue_offset: int
    store_timestamp: int
    end: int
    topic: str
    queue_id: int


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes]


# Prepared and rolled-back records never reach a consume queue; the rule lives with
# the history schema, which reports it as the "visible" column.
is_dispatched = is_visible


ArrivalListener = Callable[[str, int, int, int], None]  # topic, queueId, max offset, tags code


def _future_ms(text: str) -> bool:
    """A delivery time still to come (one already past is delivered at once)."""
    try:
        return int(text) > time.time() * 1000
    except ValueError:
        return False


class MessageStore:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        root = Path(config.storePathRootDir)
        self.root = root
        cfg_dir = root / "config"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        self.topics = TopicTable(
            cfg_dir / "topics.json",
            config.defaultTopicQueueNums,
            config.brokerPermission,
            cluster=config.brokerClusterName,
            broker_name=config.brokerName,
            auto_create=config.autoCreateTopicEnable,
            trace_topic=config.msgTraceTopicName if config.traceTopicEnable else None,
        )
        self.groups = GroupTable(
            cfg_dir / "subscriptionGroup.json", lambda: config.autoCreateSubscriptionGroup
        )
        self.offsets = OffsetTable(cfg_dir / "consumerOffset.json")
        self.delay_levels = config.delay_levels_ms
        self.commitlog = CommitLog(root / "commitlog")
        self.disk = DiskGuard(root, config)  # checked by the broker, not here
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.listeners: list[ArrivalListener] = []
        # set at every append: the ASYNC_FLUSH task sleeps on it while nothing is dirty
        self.appended = asyncio.Event()
        self.store_host = (config.brokerIP1, config.listenPort)
        self._key_index: dict[str, list[int]] | None = None
        # IndexHeader.beginTimestamp: the store time of the first message indexed, from
        # which RocketMQ's index keeps each entry's time in whole seconds
        self._index_begin: int | None = None
        # the last message indexed: its store time and commit log offset (IndexHeader's
        # endTimestamp and endPhyOffset, which QUERY_MESSAGE answers with)
        self.index_end = (0, 0)
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flushing = False
        self.recovered_messages = 0
        self.stats = BrokerStats()
        # topic -> commit log end when it was deleted: its older records stay in the log
        # (as RocketMQ's do) but are never indexed again, even after a restart
        raw = self.load_state(DELETED_TOPICS).get("deleted")
        self.deleted: dict[str, int] = (
            {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        )
        self._recover()

    def write_refusal(self) -> str | None:
        """While the disk is full, the remark RocketMQ refuses a producer's write with."""
        if not self.disk.full:
            return None
        return self.disk.send_refusal(self.commitlog.end > 0)

    # --- start-up ------------------------------------------------------------------
    def _recover(self) -> None:
        count = 0
        for msg in self.commitlog.recover():
            self._dispatch(msg)
            count += 1
        self.recovered_messages = count
        if count:
            log.info(
                "store: recovered %d messages, commit log ends at %d", count, self.commitlog.end
            )

    def _dispatch(self, msg: MessageExt) -> None:
        if not is_dispatched(msg.sys_flag):
            return
        if msg.commit_log_offset < self.deleted.get(msg.topic, -1):
            return
        cq = self.queue(msg.topic, msg.queue_id)
        if msg.queue_offset != cq.max_offset:
            log.warning(
                "store: %s/%d record at %d has queue offset %d, expected %d; re-indexed",
                msg.topic,
                msg.queue_id,
                msg.commit_log_offset,
                msg.queue_offset,
                cq.max_offset,
            )
        cq.append(msg.commit_log_offset, msg.store_size, self._tags_code(msg), msg.store_timestamp)
        if self._key_index is not None:
            self._index(msg)

    def _tags_code(self, msg: MessageExt) -> int:
        if msg.topic == TIMER_TOPIC:
            try:
                return int(msg.properties.get(TIMER_DELIVER_MS, "0"))
            except ValueError:
                return 0
        if msg.topic == SCHEDULE_TOPIC:
            level = min(int(msg.properties.get(Prop.DELAY, "1") or 1), len(self.delay_levels))
            return msg.store_timestamp + self.delay_levels[max(level, 1) - 1]
        return tags_code(msg.properties.get(Prop.TAGS))

    # --- queues --------------------------------------------------------------------
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue()
        return cq

    def find_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq else 0

    # --- writes --------------------------------------------------------------------
    def put(
        self,
        msg: MessageExt,
        *,
        keep_wait: bool = False,
        apply_delay: bool = True,
        timer: bool = False,
        properties_text: str | None = None,
        store_timestamp: int | None = None,
    ) -> PutResult:
        """Store ``msg`` (body already in its on-wire form). Delay levels are applied
        here, as RocketMQ's CommitLog does, for plain and committed messages; with
        ``timer`` a delivery time (TIMER_DELIVER_MS) too, as RocketMQ 5's store does for
        the proxy's sends. RocketMQ 4.9.7 has no timer: a remoting send keeps that
        property as any other and goes to its topic at once.
        ``properties_text``: the record's properties as written, when RocketMQ stores
        them verbatim rather than from ``msg.properties`` (a batch's entries);
        ``store_timestamp``: a batch's, one for all its messages as RocketMQ's
        putMessages stamps them (None: now)."""
        tran = msg.sys_flag & MessageSysFlag.TRANSACTION_MASK
        delay = msg.properties.get(Prop.DELAY)
        if (
            apply_delay
            and delay
            and tran in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_COMMIT)
        ):
            level = java_int(delay)  # Message.getDelayTimeLevel: parseInt, which may throw
            if level > 0:
                level = min(level, len(self.delay_levels))
                msg.properties[Prop.DELAY] = str(level)
                msg.properties[Prop.REAL_TOPIC] = msg.topic
                msg.properties[Prop.REAL_QID] = str(msg.queue_id)
                msg.topic = SCHEDULE_TOPIC
                msg.queue_id = level - 1
                keep_wait = True
        elif (
            apply_delay
            and timer
            and TIMER_DELIVER_MS in msg.properties
            and tran in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_COMMIT)
            and _future_ms(msg.properties[TIMER_DELIVER_MS])
        ):
            msg.properties[TIMER_OUT_MS] = str(timer_slot(int(msg.properties[TIMER_DELIVER_MS])))
            msg.properties[Prop.REAL_TOPIC] = msg.topic
            msg.properties[Prop.REAL_QID] = str(msg.queue_id)
            msg.topic = TIMER_TOPIC
            msg.queue_id = 0
            keep_wait = True
        if not keep_wait:
            msg.properties.pop(Prop.WAIT, None)
        began = time.monotonic()
        cq = self.queue(msg.topic, msg.queue_id) if is_dispatched(msg.sys_flag) else None
        msg.queue_offset = cq.max_offset if cq is not None else 0
        msg.commit_log_offset = self.commitlog.end
        msg.store_timestamp = (
            int(time.time() * 1000) if store_timestamp is None else store_timestamp
        )
        msg.store_host = self.store_host
        record = encode_message(msg, properties_text=properties_text)
        self.commitlog.append(record)
        self.appended.set()
        if cq is not None:
            tcode = self._tags_code(msg)
            cq.append(msg.commit_log_offset, len(record), tcode, msg.store_timestamp)
            if self._key_index is not None:
                self._index(msg)
            for listener in self.listeners:
                listener(msg.topic, msg.queue_id, cq.max_offset, tcode)
        self.stats.on_put(len(record), int((time.monotonic() - began) * 1000))
        return PutResult(
            msg.commit_log_offset,
            msg.queue_offset,
            msg.store_timestamp,
            self.commitlog.end,
            msg.topic,
            msg.queue_id,
        )

    async def wait_flushed(self, end: int) -> bool:
        """SYNC_FLUSH: resolve once everything up to ``end`` is fsynced (group commit)."""
        if self.commitlog.flushed >= end:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((end, fut))
        if not self._flushing:
            asyncio.get_running_loop().create_task(self._flush_loop())
        try:
            await within(asyncio.shield(fut), self.config.syncFlushTimeout / 1000)
        except TimeoutError:
            return False
        return True

    async def _flush_loop(self) -> None:
        self._flushing = True
        loop = asyncio.get_running_loop()
        try:
            while self._flush_waiters:
                flushed = await loop.run_in_executor(None, self.commitlog.fsync)
                still: list[tuple[int, asyncio.Future[None]]] = []
                for end, fut in self._flush_waiters:
                    if end <= flushed:
                        if not fut.done():
                            fut.set_result(None)
                    else:
                        still.append((end, fut))
                self._flush_waiters = still
        except OSError as exc:  # pragma: no cover - disk failure
            log.error("store: fsync failed: %s", exc)
            for _, fut in self._flush_waiters:
                if not fut.done():
                    fut.set_exception(exc)
            self._flush_waiters = []
        finally:
            self._flushing = False

    def flush(self) -> None:
        if self.commitlog.flushed < self.commitlog.end:
            self.commitlog.fsync()

    # --- reads ---------------------------------------------------------------------
    def read_record(self, phy: int) -> bytes | None:
        size = self.commitlog.read_size_at(phy)
        if size is None:
            return None
        return self.commitlog.read(phy, size)

    def lookup(self, phy: int) -> MessageExt | None:
        """The message stored at commit-log offset ``phy`` (body left as stored)."""
        record = self.read_record(phy)
        if record is None:
            return None
        try:
            msg, _ = decode_message(record, 0, decompress=False)
        except ValueError:
            return None
        return msg if msg.commit_log_offset == phy else None

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        codes: frozenset[int] | None,
        matches: Callable[[bytes], bool] | None = None,
    ) -> GetResult:
        """``codes``: the tag codes that pass the consume queue (None: all);
        ``matches``: a check of each record that passed them (SQL92 filters)."""
        began = time.monotonic()
        result = self._get_messages(topic, queue_id, offset, max_nums, codes, matches)
        self.stats.on_get(len(result.records), int((time.monotonic() - began) * 1000))
        return result

    def _get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        codes: frozenset[int] | None,
        matches: Callable[[bytes], bool] | None,
    ) -> GetResult:
        cq = self.queues.get((topic, queue_id))
        if cq is None or cq.max_offset == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0, [])
        lo, hi = cq.min_offset, cq.max_offset
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi, [])
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi, [])
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi, [])
        max_count = min(max(max_nums, 1), self.config.maxTransferCountOnMessageInMemory)
        max_bytes = self.config.maxTransferBytesOnMessageInMemory
        records: list[bytes] = []
        total = 0
        i = offset
        end = min(hi, offset + MAX_FILTER_SCAN)
        read = self.commitlog.read
        while i < end:
            size = cq.size[i]
            if records and (total + size > max_bytes or len(records) >= max_count):
                break
            if codes is None or cq.tags[i] in codes:
                record = read(cq.phy[i], size)
                if matches is None or matches(record):
                    records.append(record)
                    total += size
            i += 1
        status = GetStatus.FOUND if records else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, i, lo, hi, records)

    # --- key index (built on first use: QUERY_MESSAGE is a debugging tool) ---------
    def _index(self, msg: MessageExt) -> None:
        assert self._key_index is not None
        keys = msg.properties.get(Prop.KEYS, "").split(" ")
        uniq = msg.properties.get(Prop.UNIQ_KEY)
        if uniq:
            keys.append(uniq)
        for key in keys:
            if key:
                if self._index_begin is None:
                    self._index_begin = msg.store_timestamp
                self.index_end = (msg.store_timestamp, msg.commit_log_offset)
                self._key_index.setdefault(f"{msg.topic}#{key}", []).append(msg.commit_log_offset)

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[bytes]:
        if self._key_index is None:
            self._key_index = {}
            for stored in self.iter_messages():
                gone = stored.commit_log_offset < self.deleted.get(stored.topic, -1)
                if is_dispatched(stored.sys_flag) and not gone:
                    self._index(stored)
        out: list[bytes] = []
        # Found newest first, as RocketMQ's IndexFile walks a key's hash chain backwards
        # (with maxNum below the matches, the latest are the ones returned), then answered
        # in store order: DefaultMessageStore.queryMessage sorts the offsets it found.
        for phy in reversed(self._key_index.get(f"{topic}#{key}", [])):
            if len(out) >= max_num:  # IndexFile.selectPhyOffset: checked before adding
                break
            msg = self.lookup(phy)
            if msg is None or not begin <= self._indexed_time(msg.store_timestamp) <= end:
                continue
            record = self.read_record(phy)
            if record is not None:
                out.append(record)
        out.reverse()
        return out

    def _indexed_time(self, stored_at: int) -> int:
        """A message's time as IndexFile.selectPhyOffset compares it with the range:
        the index's begin plus the whole seconds since (a range ending a moment after a
        message can miss it, one starting a moment after it can find it)."""
        begin = stored_at if self._index_begin is None else self._index_begin
        return begin + (stored_at - begin) // 1000 * 1000

    def iter_messages(self, decompress: bool = False) -> Iterator[MessageExt]:
        """Every record in the log, in order (for the key index and exports)."""
        pos = 0
        end = self.commitlog.end
        while pos < end:
            size = self.commitlog.read_size_at(pos)
            if size is None:
                return
            msg, _ = decode_message(self.commitlog.read(pos, size), 0, decompress=decompress)
            yield msg
            pos += size

    def delete_topic(self, topic: str) -> None:
        """DELETE_TOPIC_IN_BROKER: the config and the consume queues go; the records stay
        in the commit log, unreachable (RocketMQ deletes the consume queue files)."""
        if self.topics.topics.pop(topic, None) is not None:
            self.topics.changed()
        for queue_key in [k for k in self.queues if k[0] == topic]:
            del self.queues[queue_key]
        self.deleted[topic] = self.commitlog.end
        self.save_state(DELETED_TOPICS, {"deleted": dict(self.deleted)})
        if self._key_index is not None:
            prefix = f"{topic}#"
            for index_key in [k for k in self._key_index if k.startswith(prefix)]:
                del self._key_index[index_key]

    # --- small persisted state -----------------------------------------------------
    def load_state(self, name: str) -> dict[str, object]:
        data = read_json(self.root / "config" / name)
        return data if isinstance(data, dict) else {}

    def save_state(self, name: str, data: dict[str, object]) -> None:
        write_json(self.root / "config" / name, data)

    def close(self) -> None:
        self.offsets.persist(force=True)
        self.flush()
        self.commitlog.close()
