"""Broker metadata: topic configs, subscription groups, consumer offsets.

Each table is persisted under ``<store>/config`` in the shape RocketMQ uses
(``topics.json``, ``subscriptionGroup.json``, ``consumerOffset.json``), so a user
can read or seed them the same way.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Container
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from idemp.remoting.codes import (
    DEFAULT_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    Perm,
)
from idemp.remoting.javafields import bool_field, int_field

from .jsonfile import read_json, write_json

log = logging.getLogger("idemp.broker")
BENCHMARK_TOPIC = "BenchmarkTest"
# The groups RocketMQ 4.9.7's SubscriptionGroupManager creates at start: mqadmin's own
# pulls (printMsg, consumeMessage, ...) use TOOLS_CONSUMER, so they work on a broker that
# does not auto-create groups.
SYSTEM_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
)
# MixAll.isSysConsumerGroup: such a group is created on first use even when
# autoCreateSubscriptionGroup is off
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127


def topic_error(topic: str) -> str | None:
    """RocketMQ's topic rules (TopicValidator.validateTopic: blank, then characters,
    then length, with its remarks); the reason a name is refused, or None."""
    if not topic or topic.isspace():
        return "The specified topic is blank."
    # fullmatch: with match(), "$" also matches before a trailing newline ("T\n").
    if not TOPIC_PATTERN.fullmatch(topic):
        return (
            "The specified topic contains illegal characters, "
            f"allowing only {TOPIC_PATTERN.pattern}"
        )
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    return None


# TopicValidator.SYSTEM_TOPIC_SET of RocketMQ 5.3.3 (and its rmq_sys_ prefix)
SYSTEM_TOPIC_NAMES = SYSTEM_TOPICS | {DEFAULT_TOPIC, "CHECKPOINT_TOPIC"}
_ALLOWED = TOPIC_PATTERN.pattern


def grpc_topic_error(topic: str, system: Container[str] = ()) -> str | None:
    """What RocketMQ 5.3.3's proxy says of a topic a 5.x client names (GrpcValidator:
    Validators.checkTopic, then no system topic), or None. ``system``: the broker's own
    system topics (its cluster's and its own name, the cluster's reply topic), which
    TopicConfigManager adds to TopicValidator's set at start."""
    if not topic or topic.isspace():
        return "The specified topic is blank"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}."
    if not TOPIC_PATTERN.fullmatch(topic):
        return f"The specified topic[{topic}] contains illegal characters, allowing only {_ALLOWED}"
    if topic in SYSTEM_TOPIC_NAMES or topic in system or topic.startswith(SYSTEM_TOPIC_PREFIX):
        return "cannot access system topic"
    return None


def grpc_group_error(group: str) -> str | None:
    """The proxy's consumer group rule (Validators.checkGroup, no CID_RMQ_SYS_ group)."""
    if not group or group.isspace():
        return "the specified group is blank"
    if len(group) > 255:
        return "the specified group is longer than group max length 255."
    if not TOPIC_PATTERN.fullmatch(group):
        return f"the specified group[{group}] contains illegal characters, allowing only {_ALLOWED}"
    if group.startswith("CID_RMQ_SYS_"):
        return "cannot use system consumer group"
    return None


TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")  # RocketMQ's enum TopicFilterType


@dataclass
class TopicConfig:
    topicName: str
    readQueueNums: int = 16
    writeQueueNums: int = 16
    perm: int = Perm.READ | Perm.WRITE
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False
    # RocketMQ 5's topic attributes (``mqadmin updateTopic -a +message.type=FIFO``);
    # written out only when set, so a 4.x tool sees a 4.x topic config
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def message_type(self) -> str:
        """NORMAL, FIFO, DELAY, TRANSACTION or MIXED (RocketMQ 5's default: NORMAL)."""
        return self.attributes.get(MESSAGE_TYPE_ATTRIBUTE, "NORMAL").upper()

    def __str__(self) -> str:
        """Java's TopicConfig.toString, which RocketMQ's error remarks quote."""
        return (
            f"TopicConfig [topicName={self.topicName}, readQueueNums={self.readQueueNums}, "
            f"writeQueueNums={self.writeQueueNums}, perm={perm_string(self.perm)}, "
            f"topicFilterType={self.topicFilterType}, topicSysFlag={self.topicSysFlag}, "
            f"order={'true' if self.order else 'false'}]"
        )


def perm_string(perm: int) -> str:
    """PermName.perm2String: R, W and X (inherited) or a dash in their place."""
    return (
        ("R" if perm & Perm.READ else "-")
        + ("W" if perm & Perm.WRITE else "-")
        + ("X" if perm & Perm.INHERIT else "-")
    )


MESSAGE_TYPE_ATTRIBUTE = "message.type"
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def topic_json(cfg: TopicConfig) -> dict[str, Any]:
    out = asdict(cfg)
    if not out["attributes"]:
        del out["attributes"]
    return out


def parse_attributes(text: str) -> dict[str, str]:
    """RocketMQ 5's ``+key=value,+key2=value2`` (``AttributeParser``); ``-key`` deletes,
    which for a new or replaced topic config means leaving it out."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item.startswith("-"):
            out.pop(item[1:], None)
            continue
        key, sep, value = item.lstrip("+").partition("=")
        if not item.startswith("+") or not sep or not key:
            raise ValueError(f"attribute {item!r} is not +key=value or -key")
        if key == MESSAGE_TYPE_ATTRIBUTE and value.upper() not in MESSAGE_TYPES:
            raise ValueError(f"message.type {value!r} is not one of {', '.join(MESSAGE_TYPES)}")
        out[key] = value
    return out


@dataclass
class DataVersion:
    """RocketMQ's DataVersion of a table: a change counter and the time of the last change
    (ms); admin tools and the nameserver read both."""

    counter: int = 0
    timestamp: int = field(default_factory=lambda: int(time.time() * 1000))

    def next(self) -> None:
        self.counter += 1
        self.timestamp = int(time.time() * 1000)

    def to_json(self) -> dict[str, int]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, raw: object) -> DataVersion:
        if not isinstance(raw, dict):
            return cls()
        out = cls(counter=int(raw.get("counter", 0)))
        if "timestamp" in raw:
            out.timestamp = int(raw["timestamp"])
        return out


class TopicTable:
    def __init__(
        self,
        path: Path,
        default_queue_nums: int,
        broker_perm: int,
        *,
        cluster: str = "DefaultCluster",
        broker_name: str = "broker-a",
        auto_create: bool = True,
        trace_topic: str | None = None,
    ) -> None:
        self.path = path
        self.topics: dict[str, TopicConfig] = {}
        self.version = DataVersion()
        data = read_json(path)
        if data:
            for name, raw in (data.get("topicConfigTable") or {}).items():
                fields = {k: raw[k] for k in TopicConfig.__dataclass_fields__ if k in raw}
                fields["topicName"] = name
                self.topics[name] = TopicConfig(**fields)
            self.version = DataVersion.from_json(data.get("dataVersion"))
        # What RocketMQ 4.9.7's TopicConfigManager creates at start (a TopicConfig's
        # default is 16 queues, perm RW). The transaction topics are not among them: the
        # half topic appears at the first check round, the check-max topic when first
        # written, the op topic never (transaction.py).
        rwx = Perm.INHERIT | Perm.READ | Perm.WRITE
        system = {
            "SELF_TEST_TOPIC": TopicConfig("SELF_TEST_TOPIC", 1, 1),
            BENCHMARK_TOPIC: TopicConfig(BENCHMARK_TOPIC, 1024, 1024),
            cluster: TopicConfig(cluster, 16, 16, rwx),
            broker_name: TopicConfig(broker_name, 1, 1, rwx),
            "OFFSET_MOVED_EVENT": TopicConfig("OFFSET_MOVED_EVENT", 1, 1),
            SCHEDULE_TOPIC: TopicConfig(SCHEDULE_TOPIC, 18, 18),
            f"{cluster}_REPLY_TOPIC": TopicConfig(f"{cluster}_REPLY_TOPIC", 1, 1),
        }
        if trace_topic:  # traceTopicEnable: the message traces' topic, one queue
            system[trace_topic] = TopicConfig(trace_topic, 1, 1)
        if auto_create:
            system[DEFAULT_TOPIC] = TopicConfig(
                DEFAULT_TOPIC, default_queue_nums, default_queue_nums, rwx
            )
        for name, cfg in system.items():
            self.topics.setdefault(name, cfg)
        self.broker_perm = broker_perm
        # called after each change (the registration with external nameservers)
        self.listeners: list[Callable[[], None]] = []

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def put(self, cfg: TopicConfig) -> TopicConfig:
        self.topics[cfg.topicName] = cfg
        self.changed()
        return cfg

    def create_in_send(
        self,
        topic: str,
        default_topic: str,
        queue_nums: int,
        *,
        auto_create: bool,
        sys_flag: int = 0,
    ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``default_topic`` as RocketMQ's
        createTopicInSendMessageMethod does: with autoCreateTopicEnable off, a send that
        names TBW102 takes its inherit bit away for good (in place, saved with the next
        change), so turning auto-creation on again at run time does not bring it back."""
        existing = self.topics.get(topic)
        if existing:
            return existing
        base = self.topics.get(default_topic)
        if base is None:
            return None
        if default_topic == DEFAULT_TOPIC and not auto_create:
            base.perm = Perm.READ | Perm.WRITE
        if not base.perm & Perm.INHERIT:
            return None
        n = max(0, min(queue_nums, base.writeQueueNums))  # none: a topic nothing is sent to
        perm = base.perm & ~Perm.INHERIT
        return self.put(TopicConfig(topic, n, n, perm, base.topicFilterType, sys_flag))

    def create_system(
        self, topic: str, queue_nums: int, perm: int, sys_flag: int = 0
    ) -> TopicConfig:
        existing = self.topics.get(topic)
        if existing:
            return existing
        return self.put(TopicConfig(topic, queue_nums, queue_nums, perm, topicSysFlag=sys_flag))

    def changed(self) -> None:
        """Count a change made in place (a deleted topic, an order flag) and save it."""
        self.version.next()
        self.persist()
        for listener in self.listeners:
            listener()

    def to_json(self) -> dict[str, Any]:
        return {
            "dataVersion": self.version.to_json(),
            "topicConfigTable": {k: topic_json(v) for k, v in self.topics.items()},
        }

    def persist(self) -> None:
        write_json(self.path, self.to_json())


@dataclass
class SubscriptionGroupConfig:
    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True
    # RocketMQ 5: a FIFO group for POP consumers (``updateSubGroup -o true``); written
    # out only when set
    consumeMessageOrderly: bool = False


def group_json(cfg: SubscriptionGroupConfig) -> dict[str, Any]:
    out = asdict(cfg)
    if not out["consumeMessageOrderly"]:
        del out["consumeMessageOrderly"]
    return out


class GroupTable:
    def __init__(self, path: Path, auto_create: Callable[[], bool]) -> None:
        self.path = path
        # read at every look-up, as SubscriptionGroupManager reads the broker's setting:
        # updateBrokerConfig autoCreateSubscriptionGroup applies at once
        self.auto_create = auto_create
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        # begun afresh at every start, whatever the file says: RocketMQ 4.9.7 loads the
        # file with fastjson, which cannot set SubscriptionGroupManager's final
        # dataVersion (no setter), so the one it takes over is new (counter 0, now)
        self.version = DataVersion()
        data = read_json(path)
        if data:
            for name, raw in (data.get("subscriptionGroupTable") or {}).items():
                self.groups[name] = _group_from_json(name, raw, strict=False)
        for name in SYSTEM_GROUPS:
            self.groups.setdefault(name, SubscriptionGroupConfig(name))

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        cfg = self.groups.get(group)
        if cfg is None and (self.auto_create() or group.startswith(SYSTEM_GROUP_PREFIX)):
            cfg = self.put(SubscriptionGroupConfig(group))
        return cfg

    def put(self, cfg: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        self.groups[cfg.groupName] = cfg
        self.version.next()
        self.persist()
        return cfg

    def remove(self, group: str) -> bool:
        if self.groups.pop(group, None) is None:
            return False
        self.version.next()
        self.persist()
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "dataVersion": self.version.to_json(),
            "subscriptionGroupTable": {k: group_json(v) for k, v in self.groups.items()},
        }

    def persist(self) -> None:
        write_json(self.path, self.to_json())


def _group_from_json(
    name: str, raw: dict[str, Any], *, strict: bool = True
) -> SubscriptionGroupConfig:
    """Each field as fastjson sets it (``"3"`` is 3, null the default, ``"x"`` for a
    number refused): kept as given, a string would fail later at each message. Not
    ``strict`` (the group file, which idemp before 2026-11-29 wrote with whatever a
    request gave), a field that does not convert keeps its default, with a warning."""
    fields: dict[str, Any] = {}
    for key, f in SubscriptionGroupConfig.__dataclass_fields__.items():
        if key == "groupName" or key not in raw:
            continue
        read = bool_field if f.type in ("bool", bool) else int_field
        try:
            value = read(raw[key], key)
        except ValueError:
            if strict:
                raise
            log.warning("group %r: %s=%r is no %s; its default kept", name, key, raw[key], f.type)
            continue
        if value is not None:
            fields[key] = value
    return SubscriptionGroupConfig(name, **fields)


def group_from_json(raw: dict[str, Any]) -> SubscriptionGroupConfig:
    """A request's config. An empty name is taken, as RocketMQ takes it; none is not."""
    name = raw.get("groupName")
    if isinstance(name, (int, float)) and not isinstance(name, bool):
        name = str(name)  # fastjson writes a number into a String field as its text
    if not isinstance(name, str):
        raise ValueError("subscription group config has no groupName")
    return _group_from_json(name, raw)


class OffsetTable:
    """``"topic@group" -> {queueId: next offset to consume}``; persisted every few seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False
        data = read_json(path)
        if data:
            for key, queues in (data.get("offsetTable") or {}).items():
                self.table[key] = {int(q): int(o) for q, o in queues.items()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table.setdefault(f"{topic}@{group}", {})[queue_id] = offset
        self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(f"{topic}@{group}", {}).get(queue_id)

    def topics_of(self, group: str) -> list[str]:
        """ConsumerOffsetManager.whichTopicByConsumer."""
        suffix = f"@{group}"
        return [k[: -len(suffix)] for k in self.table if k.endswith(suffix)]

    def remove_group(self, group: str) -> None:
        for key in [k for k in self.table if k.endswith(f"@{group}")]:
            del self.table[key]
        self.dirty = True

    def clone(self, src: str, dest: str, topic: str) -> None:
        """ConsumerOffsetManager.cloneOffset: keyed by ``topic`` as given."""
        offsets = self.table.get(f"{topic}@{src}")
        if offsets is not None:
            self.table[f"{topic}@{dest}"] = dict(offsets)
            self.dirty = True

    def persist(self, force: bool = False) -> None:
        if not (self.dirty or force):
            return
        self.dirty = False
        write_json(
            self.path,
            {
                "offsetTable": {
                    k: {str(q): o for q, o in sorted(v.items())} for k, v in self.table.items()
                }
            },
        )


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group
