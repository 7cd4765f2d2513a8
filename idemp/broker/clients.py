"""Producer and consumer groups as the broker sees them through heartbeats.

Consumers find each other through GET_CONSUMER_LIST_BY_GROUP, so the group's channel
set is the truth for rebalancing; every change to it (or to the group's
subscriptions) is pushed to the group with NOTIFY_CONSUMER_IDS_CHANGED.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from idemp.remoting.sql92 import Selector, SelectorError, compile_selector
from idemp.remoting.tags import SUB_ALL

log = logging.getLogger("idemp.broker.clients")

CHANNEL_EXPIRED_MS = 120_000

# The C++ client writes these enums as integers, Java as names.
_CONSUME_TYPE = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
_MESSAGE_MODEL = {0: "BROADCASTING", 1: "CLUSTERING"}
_CONSUME_FROM = {
    0: "CONSUME_FROM_LAST_OFFSET",
    1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    2: "CONSUME_FROM_MIN_OFFSET",
    3: "CONSUME_FROM_MAX_OFFSET",
    4: "CONSUME_FROM_FIRST_OFFSET",
    5: "CONSUME_FROM_TIMESTAMP",
}


class Channel(Protocol):
    peer: str
    closed: bool

    def send_request_oneway(
        self, code: int, ext_fields: dict[str, str], body: bytes = b""
    ) -> None: ...

    async def invoke(
        self, code: int, ext_fields: dict[str, str], body: bytes = b"", timeout: float = 5.0
    ) -> Any: ...


def _enum(value: Any, table: dict[int, str]) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return table.get(value, str(value))
    return str(value)


@dataclass
class SubscriptionData:
    topic: str
    sub_string: str
    sub_version: int
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] | None = None  # None = every message
    expression_type: str = "TAG"
    # an SQL92 expression compiled when heartbeated (ConsumerFilterManager's filter
    # data); None when it does not compile, which a pull then reports
    selector: Selector | None = None

    @classmethod
    def from_heartbeat(cls, topic: str, sub: dict[str, Any]) -> SubscriptionData:
        """A heartbeat's subscription as RocketMQ keeps it: the client's own tagsSet and
        codeSet, which the pulls then filter by (ExpressionMessageFilter matches every
        message only for a subString of exactly "*", else the codes the client sent),
        never parsed again from subString."""
        try:
            version_ms = int(sub.get("subVersion", 0))
        except (TypeError, ValueError):
            version_ms = 0
        sub_string = str(sub.get("subString", SUB_ALL))
        expression_type = str(sub.get("expressionType") or "TAG")
        if not is_tag_type(expression_type):
            selector = compile_or_none(expression_type, sub_string)
            return cls(
                topic, sub_string, version_ms, expression_type=expression_type, selector=selector
            )
        tags = frozenset(str(t) for t in sub.get("tagsSet") or ())
        if sub_string == SUB_ALL or sub.get("classFilterMode") is True:
            return cls(topic, sub_string, version_ms, tags, None, expression_type)
        codes: set[int] = set()
        for code in sub.get("codeSet") or ():
            with contextlib.suppress(TypeError, ValueError):
                codes.add(int(code))
        return cls(topic, sub_string, version_ms, tags, frozenset(codes), expression_type)


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: a missing or empty type is TAG."""
    return not expression_type or expression_type == "TAG"


def compile_or_none(expression_type: str, text: str) -> Selector | None:
    """ConsumerFilterManager.build: the compiled expression, or None (logged) when the
    type is unknown or the text does not compile."""
    if expression_type != "SQL92":
        log.warning("filter type %r is not supported", expression_type)
        return None
    try:
        return compile_selector(text)
    except SelectorError as exc:
        log.warning("SQL92 expression %r does not compile: %s", text, exc)
        return None


@dataclass
class ClientChannel:
    channel: Channel
    client_id: str
    language: str
    version: int
    last_update: float = field(default_factory=time.monotonic)
    last_update_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # for admins

    def touch(self) -> None:
        self.last_update = time.monotonic()
        self.last_update_ms = int(time.time() * 1000)


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[int, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]


class ClientManager:
    def __init__(self) -> None:
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[int, ClientChannel]] = {}

    def heartbeat(
        self, channel: Channel, body: dict[str, Any], language: str, version: int
    ) -> list[str]:
        """Register the heartbeat; return the consumer groups whose membership or
        subscriptions changed (to be notified)."""
        client_id = str(body.get("clientID", ""))
        changed: list[str] = []
        key = id(channel)
        for data in body.get("consumerDataSet") or []:
            group = str(data.get("groupName", ""))
            if not group:
                continue
            info = self.consumers.get(group)
            if info is None:
                info = self.consumers[group] = ConsumerGroupInfo(group)
            info.consume_type = _enum(data.get("consumeType", 1), _CONSUME_TYPE)
            info.message_model = _enum(data.get("messageModel", 1), _MESSAGE_MODEL)
            info.consume_from_where = _enum(data.get("consumeFromWhere", 0), _CONSUME_FROM)
            existing = info.channels.get(key)
            if existing is None or existing.client_id != client_id:
                info.channels[key] = ClientChannel(channel, client_id, language, version)
                changed.append(group)
            else:
                existing.touch()
            subs: dict[str, SubscriptionData] = {}
            for sub in data.get("subscriptionDataSet") or []:
                topic = str(sub.get("topic", ""))
                if not topic:
                    continue
                subs[topic] = SubscriptionData.from_heartbeat(topic, sub)
            if _update_subscriptions(info.subscriptions, subs) and group not in changed:
                changed.append(group)
        for data in body.get("producerDataSet") or []:
            group = str(data.get("groupName", ""))
            if not group:
                continue
            chans = self.producers.setdefault(group, {})
            existing = chans.get(key)
            if existing is None or existing.client_id != client_id:
                chans[key] = ClientChannel(channel, client_id, language, version)
            else:
                existing.touch()
        return changed

    def unregister(
        self, channel: Channel, consumer_group: str | None, producer_group: str | None
    ) -> list[str]:
        changed: list[str] = []
        key = id(channel)
        if consumer_group:
            info = self.consumers.get(consumer_group)
            if info and info.channels.pop(key, None) is not None:
                changed.append(consumer_group)
                if not info.channels:
                    del self.consumers[consumer_group]
        if producer_group:
            chans = self.producers.get(producer_group)
            if chans is not None:
                chans.pop(key, None)
                if not chans:
                    del self.producers[producer_group]
        return changed

    def channel_closed(self, channel: Channel) -> list[str]:
        key = id(channel)
        changed: list[str] = []
        for group, info in list(self.consumers.items()):
            if info.channels.pop(key, None) is not None:
                changed.append(group)
                if not info.channels:
                    del self.consumers[group]
        # ProducerManager.doChannelCloseEvent keeps a group it emptied (only an
        # unregistration removes one): producerConnection then finds no connection
        for chans in self.producers.values():
            chans.pop(key, None)
        return changed

    def expire(self, now: float | None = None) -> list[Channel]:
        """Channels silent for 120 s; the caller closes them (which unregisters them)."""
        now = time.monotonic() if now is None else now
        stale: list[Channel] = []
        for info in self.consumers.values():
            stale += [
                c.channel
                for c in info.channels.values()
                if now - c.last_update > CHANNEL_EXPIRED_MS / 1000
            ]
        for chans in self.producers.values():
            stale += [
                c.channel for c in chans.values() if now - c.last_update > CHANNEL_EXPIRED_MS / 1000
            ]
        return list({id(c): c for c in stale}.values())

    def find_producer(self, client_id: str) -> ClientChannel | None:
        """ProducerManager.findChannel: a live producer connection of that client id."""
        for chans in self.producers.values():
            for chan in chans.values():
                if chan.client_id == client_id and not chan.channel.closed:
                    return chan
        return None

    def producer_channel(self, group: str) -> ClientChannel | None:
        chans = self.producers.get(group)
        if not chans:
            return None
        live = [c for c in chans.values() if not c.channel.closed]
        return live[0] if live else None


def _update_subscriptions(
    table: dict[str, SubscriptionData], new: dict[str, SubscriptionData]
) -> bool:
    """Apply a heartbeat's subscriptions as RocketMQ 4.9.7's
    ConsumerGroupInfo.updateSubscription does: a newer subVersion replaces the stored one
    even when the expression is unchanged (the Java client raises it after each
    rebalance and pulls without a subscription of its own), an older one is ignored, and
    topics the heartbeat no longer lists are dropped. Only added or dropped topics count
    as a change worth notifying."""
    updated = False
    for topic, sub in new.items():
        old = table.get(topic)
        if old is None:
            table[topic] = sub
            updated = True
        elif sub.sub_version > old.sub_version:
            table[topic] = sub
    for topic in [t for t in table if t not in new]:
        del table[topic]
        updated = True
    return updated
