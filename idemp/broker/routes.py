"""The routes of brokers that registered with a nameserver (RocketMQ's RouteInfoManager).

A nameserver process of idemp holds two kinds of brokers: its own (the embedded one,
whose routes are read live from its topic table, see ``namesrv``) and the ones that
sent REGISTER_BROKER, idemp's or RocketMQ's. This table keeps the second kind as
RocketMQ 4.9.7's nameserver keeps every broker:

* a registration replaces a topic's queue data only when the broker's topic table
  version changed, or on the broker's first registration (so ``wipeWritePerm`` holds
  until the broker's topics change), and never removes a topic the broker dropped;
* a broker disappears on UNREGISTER_BROKER, when its connection closes, or when it has
  not registered for two minutes; its topics go with it where it was their only broker.

Pure data: the handlers pass the connection and the clock in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from idemp.remoting.codes import Perm

MASTER_ID = 0
EXPIRY_S = 120.0  # RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME


@dataclass
class LiveBroker:
    """BrokerLiveInfo: when a broker last registered, with which topic table version."""

    addr: str
    data_version: dict[str, Any]
    peer: object
    ha_addr: str
    last_update: float


@dataclass
class BrokerEntry:
    """BrokerData: a broker name's cluster and its addresses by broker id."""

    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)


def queue_data(broker_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "brokerName": broker_name,
        "perm": int(cfg.get("perm", Perm.READ | Perm.WRITE)),
        "readQueueNums": int(cfg.get("readQueueNums", 16)),
        "topicSysFlag": int(cfg.get("topicSysFlag", 0)),
        "writeQueueNums": int(cfg.get("writeQueueNums", 16)),
    }


class RouteTable:
    def __init__(self) -> None:
        self.topics: dict[str, dict[str, dict[str, Any]]] = {}  # topic -> name -> queue data
        self.brokers: dict[str, BrokerEntry] = {}  # broker name ->
        self.clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self.live: dict[str, LiveBroker] = {}  # broker address ->

    def register(
        self,
        *,
        cluster: str,
        addr: str,
        name: str,
        broker_id: int,
        ha_addr: str,
        topics: dict[str, dict[str, Any]],
        data_version: dict[str, Any],
        peer: object,
        now: float,
    ) -> tuple[str | None, str | None]:
        """RouteInfoManager.registerBroker; returns (master address, its HA address) for
        a slave whose master is registered."""
        self.clusters.setdefault(cluster, set()).add(name)
        entry = self.brokers.get(name)
        first = entry is None
        if entry is None:
            entry = self.brokers[name] = BrokerEntry(cluster)
        # the same address under another id (a slave become master) is dropped first
        for bid in [b for b, a in entry.addrs.items() if a == addr and b != broker_id]:
            del entry.addrs[bid]
        first = first or broker_id not in entry.addrs
        entry.addrs[broker_id] = addr
        if broker_id == MASTER_ID and (first or self.changed(addr, data_version)):
            for topic, cfg in topics.items():
                self.topics.setdefault(topic, {})[name] = queue_data(name, cfg)
        self.live[addr] = LiveBroker(addr, dict(data_version), peer, ha_addr, now)
        if broker_id != MASTER_ID:
            master = entry.addrs.get(MASTER_ID)
            if master is not None and master in self.live:
                return master, self.live[master].ha_addr
        return None, None

    def changed(self, addr: str, data_version: dict[str, Any]) -> bool:
        """isBrokerTopicConfigChanged: DataVersion.equals compares counter and timestamp."""
        live = self.live.get(addr)
        return live is None or _version_key(live.data_version) != _version_key(data_version)

    def touch(self, addr: str, now: float) -> None:
        live = self.live.get(addr)
        if live is not None:
            live.last_update = now

    def unregister(self, cluster: str, addr: str, name: str, broker_id: int) -> None:
        self.live.pop(addr, None)
        entry = self.brokers.get(name)
        if entry is None:
            return
        entry.addrs.pop(broker_id, None)
        if not entry.addrs:
            del self.brokers[name]
            names = self.clusters.get(cluster)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.clusters[cluster]
            self._drop_topics_of(name)

    def connection_closed(self, peer: object) -> None:
        """onChannelDestroy: the broker that registered on this connection is gone."""
        for addr in [a for a, live in self.live.items() if live.peer is peer]:
            self._remove_addr(addr)

    def expire(self, now: float) -> list[str]:
        """scanNotActiveBroker: brokers silent for two minutes are removed."""
        gone = [a for a, live in self.live.items() if live.last_update + EXPIRY_S < now]
        for addr in gone:
            self._remove_addr(addr)
        return gone

    def _remove_addr(self, addr: str) -> None:
        self.live.pop(addr, None)
        for name, entry in list(self.brokers.items()):
            ids = [b for b, a in entry.addrs.items() if a == addr]
            if not ids:
                continue
            for bid in ids:
                del entry.addrs[bid]
            if not entry.addrs:
                del self.brokers[name]
                for cluster, names in list(self.clusters.items()):
                    if name in names:
                        names.discard(name)
                        if not names:
                            del self.clusters[cluster]
                        break
                self._drop_topics_of(name)
            return

    def _drop_topics_of(self, name: str) -> None:
        for topic, by_broker in list(self.topics.items()):
            by_broker.pop(name, None)
            if not by_broker:
                del self.topics[topic]

    # --- what the nameserver's answers read ------------------------------------------
    def queue_datas(self, topic: str) -> list[dict[str, Any]]:
        """The topic's queue data of brokers still registered (pickupTopicRouteData
        answers only when both exist)."""
        return [
            qd for name, qd in sorted(self.topics.get(topic, {}).items()) if name in self.brokers
        ]

    def broker_data(self, name: str) -> dict[str, Any] | None:
        entry = self.brokers.get(name)
        if entry is None:
            return None
        return {
            "brokerAddrs": {str(b): a for b, a in sorted(entry.addrs.items())},
            "brokerName": name,
            "cluster": entry.cluster,
        }

    def set_write_perm(self, name: str, writable: bool) -> int:
        """operateWritePermOfBroker: the count of topics the broker has queues of."""
        count = 0
        for by_broker in self.topics.values():
            qd = by_broker.get(name)
            if qd is not None:
                qd["perm"] = Perm.READ | Perm.WRITE if writable else qd["perm"] & ~Perm.WRITE
                count += 1
        return count

    def delete_topic(self, topic: str, cluster: str | None) -> None:
        """deleteTopic: from every broker, or from the brokers of one cluster."""
        if not cluster:
            self.topics.pop(topic, None)
            return
        by_broker = self.topics.get(topic)
        if by_broker is None:
            return
        for name in self.clusters.get(cluster, set()):
            by_broker.pop(name, None)
        if not by_broker:
            del self.topics[topic]


def _version_key(version: dict[str, Any]) -> tuple[int, int]:
    return int(version.get("counter", 0)), int(version.get("timestamp", 0))
