"""Topic routes as a nameserver returns them, and the queues derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from idemp.remoting.codes import Perm
from idemp.remoting.route import parse_route

MASTER_ID = 0


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """Sort order (topic, broker, queue) is the order every client allocates in."""

    topic: str
    broker_name: str
    queue_id: int

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclass
class TopicRoute:
    topic: str
    brokers: dict[str, dict[int, str]] = field(default_factory=dict)
    queue_datas: list[dict[str, Any]] = field(default_factory=list)
    order_topic_conf: str | None = None

    @classmethod
    def parse(cls, topic: str, body: bytes) -> TopicRoute:
        """Accepts fastjson's bare integer keys (``{0:"ip:port"}``)."""
        brokers, queue_datas, order_topic_conf = parse_route(body)
        return cls(topic, brokers, queue_datas, order_topic_conf)

    def with_topic(self, topic: str, max_queues: int | None = None) -> TopicRoute:
        """A route borrowed from TBW102 for a topic the broker will auto-create."""
        qds = []
        for qd in self.queue_datas:
            qd = dict(qd)
            if max_queues is not None:
                qd["readQueueNums"] = min(max_queues, int(qd.get("readQueueNums", 0)))
                qd["writeQueueNums"] = min(max_queues, int(qd.get("writeQueueNums", 0)))
            qds.append(qd)
        return TopicRoute(topic, dict(self.brokers), qds, self.order_topic_conf)

    def publish_queues(self) -> list[MessageQueue]:
        """Writable queues of brokers that have a master, in route order (Java/C++)."""
        out: list[MessageQueue] = []
        if self.order_topic_conf:
            for item in self.order_topic_conf.split(";"):
                name, _, nums = item.partition(":")
                if name and nums.isdigit():
                    out += [MessageQueue(self.topic, name, i) for i in range(int(nums))]
            return out
        for qd in sorted(self.queue_datas, key=lambda q: str(q.get("brokerName"))):
            name = str(qd.get("brokerName"))
            if not int(qd.get("perm", 0)) & Perm.WRITE:
                continue
            if MASTER_ID not in self.brokers.get(name, {}):
                continue
            out += [MessageQueue(self.topic, name, i) for i in range(int(qd["writeQueueNums"]))]
        return out

    def subscribe_queues(self) -> list[MessageQueue]:
        out: list[MessageQueue] = []
        for qd in self.queue_datas:
            if not int(qd.get("perm", 0)) & Perm.READ:
                continue
            name = str(qd.get("brokerName"))
            out += [MessageQueue(self.topic, name, i) for i in range(int(qd["readQueueNums"]))]
        return sorted(out)
