"""Consumer offset stores: the broker's table (clustering) or a local file (broadcasting).

Offsets are "next offset to consume". They live in memory, are pushed to their store
every ``persist_offset_interval`` (5 s) and at shutdown, and a queue that leaves this
consumer is persisted synchronously before its lock is given up, so its next owner
starts exactly where this one stopped.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from idemp.remoting import RequestCode, ResponseCode

from .route import MessageQueue
from .transport import RemotingError, ResponseError

if TYPE_CHECKING:
    from .instance import ClientInstance

log = logging.getLogger("idemp.client.offsets")

NOT_FOUND = -1  # no stored offset: apply CONSUME_FROM_*
READ_FAILED = -2  # could not ask: skip the queue until the next rebalance (Java)


class OffsetStore:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = True) -> None:
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int | None:
        return self.table.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    async def load(self) -> None:
        return None

    async def read_store(self, mq: MessageQueue) -> int:
        raise NotImplementedError

    async def persist(self, mq: MessageQueue, sync: bool = True) -> None:
        raise NotImplementedError

    async def persist_all(self, mqs: list[MessageQueue], sync: bool = False) -> None:
        raise NotImplementedError


class RemoteOffsetStore(OffsetStore):
    """Clustering: UPDATE_CONSUMER_OFFSET (oneway on the timer) to the queue's broker."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group

    async def read_store(self, mq: MessageQueue) -> int:
        addr = self.instance.admin_addr(mq.broker_name)
        if addr is None:
            await self.instance.update_route(mq.topic)
            addr = self.instance.admin_addr(mq.broker_name)
        if addr is None:
            return READ_FAILED
        try:
            resp = await self.instance.broker_call(
                addr,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id)},
            )
        except RemotingError as exc:
            log.info("offset query of %s failed: %s", mq, exc)
            return READ_FAILED
        if resp.code != ResponseCode.SUCCESS:
            return NOT_FOUND
        offset = int(resp.ext_fields.get("offset", "-1"))
        self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mq: MessageQueue, sync: bool = True) -> None:
        offset = self.table.get(mq)
        if offset is None:
            return
        addr = self.instance.admin_addr(mq.broker_name)
        if addr is None:
            return
        ext = {
            "consumerGroup": self.group,
            "topic": mq.topic,
            "queueId": str(mq.queue_id),
            "commitOffset": str(offset),
        }
        if sync:
            resp = await self.instance.broker_call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
            if resp.code != ResponseCode.SUCCESS:
                raise ResponseError(resp.code, resp.remark, f"offset update of {mq}")
        else:
            await self.instance.broker_oneway(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)

    async def persist_all(self, mqs: list[MessageQueue], sync: bool = False) -> None:
        for mq in mqs:
            try:
                await self.persist(mq, sync)
            except RemotingError as exc:
                log.info("offset persist of %s failed: %s", mq, exc)


class LocalFileOffsetStore(OffsetStore):
    """Broadcasting: ``<dir>/<ip@instance>/<group>/offsets.json``, as RocketMQ's
    LocalFileOffsetStore (dir defaults to ``~/.rocketmq_offsets``), written atomically:
    temp file, fsync, rename; the previous file is kept as ``offsets.json.bak``.

    Format: ``{"offsetTable": [{"topic", "brokerName", "queueId", "offset"}, ...]}``
    (standard JSON, unlike Java's object-keyed map).
    """

    def __init__(self, base_dir: str | None, client_key: str, group: str) -> None:
        super().__init__()
        root = Path(base_dir) if base_dir else Path.home() / ".rocketmq_offsets"
        self.path = root / client_key / group / "offsets.json"
        self.stored: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        for candidate in (self.path, self.path.with_suffix(".json.bak")):
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for e in data.get("offsetTable") or []:
                mq = MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"]))
                self.stored[mq] = int(e["offset"])
            return

    async def read_store(self, mq: MessageQueue) -> int:
        offset = self.stored.get(mq)
        if offset is None:
            return NOT_FOUND
        self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mq: MessageQueue, sync: bool = True) -> None:
        await self.persist_all([mq], sync)

    async def persist_all(self, mqs: list[MessageQueue], sync: bool = False) -> None:
        changed = False
        for mq in mqs:
            offset = self.table.get(mq)
            if offset is not None and self.stored.get(mq) != offset:
                self.stored[mq] = offset
                changed = True
        if changed:
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "offsetTable": [
                {"topic": m.topic, "brokerName": m.broker_name, "queueId": m.queue_id, "offset": o}
                for m, o in sorted(self.stored.items())
            ]
        }
        fd, tmp = tempfile.mkstemp(prefix=".offsets.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():
                os.replace(self.path, self.path.with_suffix(".json.bak"))
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
