"""The nameserver: the embedded broker's routes come straight from its topic table;
brokers that register (REGISTER_BROKER, idemp's or RocketMQ's) are kept in a
``RouteTable``, and every answer merges the two. ``idemp namesrv`` runs the same
handlers with no broker of its own.

Route JSON is written as a real nameserver writes it: bare integer map keys
(``{0:"ip:port"}``) unless the client is 4.9.4+ or asks for standard JSON.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import Perm, TopicSysFlag
from idemp.remoting.javahash import hash_map_order

from .config import as_java_field, kind_of, read_properties
from .kvconfig import ORDER_TOPIC_CONFIG
from .registration import RegisterBodyError, body_crc32, decode_register_body, registered_perm
from .rocketmq_defaults import namesrv_settings

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer
    from .metadata import TopicConfig

log = logging.getLogger("idemp.namesrv")

V4_9_4 = 401
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.REGISTER_BROKER] = register_broker
    handlers[RequestCode.UNREGISTER_BROKER] = unregister_broker
    handlers[RequestCode.QUERY_DATA_VERSION] = query_data_version
    handlers[RequestCode.GET_ROUTEINFO_BY_TOPIC] = route_info
    handlers[RequestCode.GET_BROKER_CLUSTER_INFO] = cluster_info
    handlers[RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER] = topic_list
    handlers[RequestCode.PUT_KV_CONFIG] = put_kv
    handlers[RequestCode.GET_KV_CONFIG] = get_kv
    handlers[RequestCode.DELETE_KV_CONFIG] = delete_kv
    handlers[RequestCode.GET_KVLIST_BY_NAMESPACE] = kv_list
    handlers[RequestCode.WIPE_WRITE_PERM_OF_BROKER] = wipe_write_perm
    handlers[RequestCode.ADD_WRITE_PERM_OF_BROKER] = add_write_perm
    handlers[RequestCode.DELETE_TOPIC_IN_NAMESRV] = delete_topic_route
    handlers[RequestCode.GET_TOPICS_BY_CLUSTER] = topics_by_cluster
    handlers[RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS] = system_topics
    handlers[RequestCode.GET_UNIT_TOPIC_LIST] = unit_topics(TopicSysFlag.UNIT, 0)
    handlers[RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST] = unit_topics(TopicSysFlag.UNIT_SUB, 0)
    handlers[RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST] = unit_topics(
        TopicSysFlag.UNIT_SUB, TopicSysFlag.UNIT
    )
    handlers[RequestCode.GET_NAMESRV_CONFIG] = get_config
    handlers[RequestCode.UPDATE_NAMESRV_CONFIG] = update_config


class HashOrdered(dict[str, Any]):
    """A Java HashMap's entries already in its iteration order: written as they are,
    where every other object is a bean whose fields fastjson writes sorted."""


def _fields_sorted(obj: Any) -> Any:
    if isinstance(obj, HashOrdered):
        return {k: _fields_sorted(v) for k, v in obj.items()}
    if isinstance(obj, dict):
        return {k: _fields_sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_fields_sorted(v) for v in obj]
    return obj


def _dumps(obj: Any, standard: bool) -> bytes:
    text = json.dumps(_fields_sorted(obj), separators=(",", ":"))
    if not standard:
        # fastjson's default for Map<Long, String>: the broker id keys unquoted.
        text = _BROKER_ID_KEY.sub(r"\1\2:", text)
    return text.encode()


_BROKER_ID_KEY = re.compile(r'([{,])"(\d+)":(?="[^"]*")')


def _java_str(value: str | None) -> str:
    """A header field as Java's string concatenation writes it: absent reads "null"."""
    return "null" if value is None else value


def _broker_data(server: Broker) -> dict[str, Any]:
    return {
        "brokerAddrs": {"0": server.broker_addr},
        "brokerName": server.config.brokerName,
        "cluster": server.config.brokerClusterName,
    }


def route_info(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    # no topic: RocketMQ's header decoding lets the field be null, and null has no route
    topic = cmd.ext_fields.get("topic")
    if topic is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: null{FAQ}",
        )
    queue_datas: list[dict[str, Any]] = []
    broker_datas: list[dict[str, Any]] = []
    tcfg = None
    if server.store is not None and _routed(server, topic):
        tcfg = server.store.topics.get(topic)
    if tcfg is not None:
        broker_datas.append(_broker_data(server))
        queue_datas.append(
            {
                "brokerName": server.config.brokerName,
                "perm": route_perm(server, tcfg),
                "readQueueNums": tcfg.readQueueNums,
                "topicSysFlag": tcfg.topicSysFlag,
                "writeQueueNums": tcfg.writeQueueNums,
            }
        )
    routes = server.namesrv.routes
    for qd in routes.queue_datas(topic):
        bd = routes.broker_data(qd["brokerName"])
        if bd is not None:
            queue_datas.append(dict(qd))
            broker_datas.append(bd)
    if not queue_datas:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {topic}{FAQ}",
        )
    # pickupTopicRouteData lists both from hash maps keyed by broker name
    order = {n: i for i, n in enumerate(hash_map_order(q["brokerName"] for q in queue_datas))}
    queue_datas.sort(key=lambda q: order[q["brokerName"]])
    broker_datas.sort(key=lambda b: order[b["brokerName"]])
    standard = cmd.version >= V4_9_4 or cmd.field_bool("acceptStandardJsonOnly")
    body: dict[str, Any] = {
        "brokerDatas": broker_datas,
        "filterServerTable": {},
        "queueDatas": queue_datas,
    }
    # DefaultRequestProcessor.getRouteInfoByTopic reads the order config only with the
    # nameserver's orderMessageEnable (false by default; updateNamesrvConfig sets it)
    if server.namesrv.settings.get("orderMessageEnable", "").lower() == "true":
        order_conf = server.namesrv.get(ORDER_TOPIC_CONFIG, topic)
        if order_conf is not None:
            body["orderTopicConf"] = order_conf
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, standard))


def register_broker(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """DefaultRequestProcessor.registerBrokerWithFilterServer: the body's CRC checked
    when given, the broker's topics taken into the route table, and the answer carries
    the ORDER_TOPIC_CONFIG table (the broker sets its topics' order flag from it)."""
    cmd.require("brokerName", "brokerAddr", "clusterName", "haServerAddr", "brokerId")
    fields = cmd.ext_fields
    crc = cmd.field_int("bodyCrc32", 0)
    if crc != 0 and crc != body_crc32(cmd.body or b""):
        log.warning("REGISTER_BROKER from %s: crc32 not match", conn.peer)
        return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
    name, addr = fields["brokerName"], fields["brokerAddr"]
    if server.store is not None and addr != server.broker_addr and _is_local(server, name):
        # RocketMQ would take the newcomer as the name's new master; here that would hide
        # this process's own broker, which is never what two brokers started alike meant
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"brokerName {name} is this nameserver's own broker ({server.broker_addr}); "
            f"start the broker at {addr} with another brokerName",
        )
    topics: dict[str, dict[str, Any]] = {}
    version: dict[str, Any] = {"counter": 0, "timestamp": 0}
    if cmd.body:
        try:
            topics, version = decode_register_body(cmd.body, cmd.field_bool("compressed"))
        except RegisterBodyError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    master, ha = server.namesrv.routes.register(
        cluster=fields["clusterName"],
        addr=addr,
        name=name,
        broker_id=cmd.field_int("brokerId"),
        ha_addr=fields["haServerAddr"],
        topics=topics,
        data_version=version,
        peer=conn,
        now=time.monotonic(),
    )
    header = {k: v for k, v in (("masterAddr", master), ("haServerAddr", ha)) if v is not None}
    table = server.namesrv.table(ORDER_TOPIC_CONFIG)
    body = _dumps({"table": table}, True) if table is not None else b""
    return cmd.response(ResponseCode.SUCCESS, ext_fields=header, body=body)


def unregister_broker(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("brokerName", "brokerAddr", "clusterName", "brokerId")
    fields = cmd.ext_fields
    server.namesrv.routes.unregister(
        fields["clusterName"], fields["brokerAddr"], fields["brokerName"], cmd.field_int("brokerId")
    )
    return cmd.response(ResponseCode.SUCCESS)


def query_data_version(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """The broker's question before a registration it may skip (``forceRegister=false``):
    has my topic table changed since you last took it? An unchanged one counts as alive."""
    # RocketMQ decodes the body before it reads a field: without one it fails there
    # (SYSTEM_ERROR), and a missing brokerAddr is a broker it never heard of
    if not cmd.body:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            "QUERY_DATA_VERSION without a body: the broker's DataVersion is needed",
        )
    try:
        version = json.loads(cmd.body)
    except ValueError as exc:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"the body is not a DataVersion: {exc}")
    addr = cmd.ext_fields.get("brokerAddr", "")  # no address: a broker never heard of
    routes = server.namesrv.routes
    live = routes.live.get(addr)
    changed = live is None or not isinstance(version, dict) or routes.changed(addr, version)
    if not changed:
        routes.touch(addr, time.monotonic())
    body = _dumps(live.data_version, True) if live is not None else b""
    return cmd.response(
        ResponseCode.SUCCESS, ext_fields={"changed": "true" if changed else "false"}, body=body
    )


def route_perm(server: Broker, tcfg: TopicConfig) -> int:
    """The perm this broker's queues of the topic have in the route: as registered, or as
    wipeWritePerm/addWritePerm made it since."""
    ns = server.namesrv
    assert server.store is not None
    kept = ns.route_perm.get(tcfg.topicName)
    # void once the topic registered again: alone (a new config) or with the whole table
    if (
        kept is not None
        and kept[0] is tcfg
        and ns.route_perm_version == server.store.topics.version.counter
    ):
        return kept[1]
    return registered_perm(server.config.brokerPermission, tcfg.perm)


def _set_route_perms(server: Broker, perm: Callable[[int], int]) -> int:
    """RouteInfoManager.operateWritePermOfBroker on this broker's queue data: each routed
    topic's perm as ``perm`` makes it from the route's. Kept until the topic is registered
    again: alone when it is created or updated (``registered_one``), or with every topic
    when anything else changes the broker's table (a topic created by a send or a
    send-back, one deleted, an order flag, ``brokerPermission``), as RocketMQ's broker
    registers its whole table then, at once or with its next periodic registration."""
    assert server.store is not None
    perms: dict[str, tuple[object, int]] = {
        name: (tcfg, perm(route_perm(server, tcfg)))
        for name, tcfg in server.store.topics.topics.items()
        if _routed(server, name)
    }
    server.namesrv.route_perm = perms
    server.namesrv.route_perm_version = server.store.topics.version.counter
    return len(perms)


def registered_one(server: Broker, version_before: int) -> None:
    """registerIncrementBrokerData: one topic registered with the table's new version; the
    perms set on the others stay."""
    assert server.store is not None
    if server.namesrv.route_perm_version == version_before:
        server.namesrv.route_perm_version = server.store.topics.version.counter


def _routed(server: Broker, topic: str) -> bool:
    """False while a route deleted from the nameserver has not been registered again
    (the broker registers its topics again when its topic table changes); False for
    every topic in a nameserver without a broker of its own."""
    if server.store is None:
        return False
    deleted_at = server.namesrv.deleted_routes.get(topic)
    return deleted_at is None or server.store.topics.version.counter > deleted_at


def _clusters(server: Broker) -> dict[str, set[str]]:
    out = {c: set(names) for c, names in server.namesrv.routes.clusters.items()}
    if server.store is not None:
        out.setdefault(server.config.brokerClusterName, set()).add(server.config.brokerName)
    return out


def cluster_info(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    routes = server.namesrv.routes
    brokers = {name: routes.broker_data(name) for name in routes.brokers}
    if server.store is not None:
        brokers[server.config.brokerName] = _broker_data(server)
    clusters = _clusters(server)
    # RouteInfoManager's tables as its HashMaps iterate them (created with 128 and 32
    # buckets; each cluster's names a HashSet), which is how RocketMQ writes them
    body = {
        "brokerAddrTable": HashOrdered(
            (n, brokers[n]) for n in hash_map_order(sorted(brokers), 128)
        ),
        "clusterAddrTable": HashOrdered(
            (c, hash_map_order(sorted(clusters[c]))) for c in hash_map_order(clusters, 32)
        ),
    }
    # ClusterInfo.encode(): fastjson's defaults whatever the client's version (only the
    # route answer turns standard for 4.9.4+), so the broker ids are bare keys
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, False))


def _local_topics(server: Broker) -> list[str]:
    """This broker's routed topics, in the order they were created."""
    local = server.store.topics.topics if server.store is not None else {}
    return [t for t in local if _routed(server, t)]


def _topic_list(names: Iterable[str], **extra: Any) -> bytes:
    """A TopicList: RocketMQ's is a HashSet, filled with ``names`` in this order, so
    mqadmin, filling its own from the answer, prints topics of one bucket in it."""
    return _dumps({"topicList": hash_map_order(names), **extra}, True)


def _topic_table(server: Broker, local: list[str] | None = None) -> list[str]:
    """Every routed topic as RouteInfoManager's topicQueueTable (a HashMap created with
    1024 buckets, filled as topics first registered) iterates them: the order the topic
    lists fill their sets in, which decides the order within a set's bucket. ``local``:
    this broker's routed topics, when the caller has them already."""
    if local is None:
        local = _local_topics(server)
    return hash_map_order([*local, *server.namesrv.routes.topics], 1024)


def topic_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, body=_topic_list(_topic_table(server)))


def put_kv(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace, key = cmd.ext_fields.get("namespace"), cmd.ext_fields.get("key")
    if namespace is None or key is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "namespace or key is null")
    server.namesrv.put(namespace, key, cmd.ext_fields.get("value"))
    if namespace == ORDER_TOPIC_CONFIG:
        sync_order_topics(server)
    return cmd.response(ResponseCode.SUCCESS)


def sync_order_topics(server: Broker) -> None:
    """TopicConfigManager.updateOrderTopicConfig, which RocketMQ's broker runs with the
    KV table each registration answers: a topic is ``order`` exactly when the
    nameserver's ORDER_TOPIC_CONFIG names it (here at once, registration being local)."""
    if server.store is not None:  # a nameserver alone: its brokers learn at registration
        apply_order_topics(server, server.namesrv.table(ORDER_TOPIC_CONFIG))


def apply_order_topics(server: Broker, ordered: dict[str, str] | None) -> None:
    """updateOrderTopicConfig with the table a registration answered."""
    assert server.store is not None
    if ordered is None:  # no such namespace: the registration carries no table
        return
    changed = False
    for name, cfg in server.store.topics.topics.items():
        want = name in ordered
        if cfg.order != want:
            cfg.order = want
            changed = True
    if changed:
        server.store.topics.changed()


def get_kv(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace, key = cmd.ext_fields.get("namespace"), cmd.ext_fields.get("key")
    value = None
    if namespace is not None and key is not None:  # a null key or namespace is never kept
        value = server.namesrv.get(namespace, key)
    if value is None:  # Java's string concatenation: an absent field reads "null"
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            f"No config item, Namespace: {_java_str(namespace)} Key: {_java_str(key)}",
        )
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"value": value})


def delete_kv(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace, key = cmd.ext_fields.get("namespace"), cmd.ext_fields.get("key")
    if namespace is not None and key is not None:  # a null one names nothing kept
        server.namesrv.delete(namespace, key)
    if namespace == ORDER_TOPIC_CONFIG:
        sync_order_topics(server)
    return cmd.response(ResponseCode.SUCCESS)


def kv_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace = cmd.ext_fields.get("namespace")
    table = server.namesrv.table(namespace) if namespace is not None else None
    if table is None:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {_java_str(namespace)}"
        )
    return cmd.response(ResponseCode.SUCCESS, body=_dumps({"table": table}, True))


def _is_local(server: Broker, broker_name: str) -> bool:
    return server.store is not None and broker_name == server.config.brokerName


def wipe_write_perm(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RouteInfoManager.wipeWritePermOfBrokerByLock: the broker's queues lose the write
    bit in every route; the answer counts the topics touched."""
    name = cmd.ext_fields.get("brokerName", "")
    if _is_local(server, name):
        count = _set_route_perms(server, lambda perm: perm & ~Perm.WRITE)
    else:
        count = server.namesrv.routes.set_write_perm(name, writable=False)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"wipeTopicCount": str(count)})


def add_write_perm(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    name = cmd.ext_fields.get("brokerName", "")
    if _is_local(server, name):
        # not the topic's own perm back: RocketMQ's nameserver sets read and write
        count = _set_route_perms(server, lambda perm: Perm.READ | Perm.WRITE)
    else:
        count = server.namesrv.routes.set_write_perm(name, writable=True)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"addTopicCount": str(count)})


def delete_topic_route(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """deleteTopic: from every broker, or (``clusterName`` given) that cluster's. No
    topic deletes nothing, and succeeds (RocketMQ goes on with the field null)."""
    topic, cluster = cmd.ext_fields.get("topic"), cmd.ext_fields.get("clusterName")
    if topic is None:
        return cmd.response(ResponseCode.SUCCESS)
    if server.store is not None and cluster in (None, "", server.config.brokerClusterName):
        server.namesrv.deleted_routes[topic] = server.store.topics.version.counter
    server.namesrv.routes.delete_topic(topic, cluster)
    return cmd.response(ResponseCode.SUCCESS)


def topics_by_cluster(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """getTopicsByCluster: for each of the cluster's brokers (its set's order), the
    topics of the topic table that broker serves."""
    cluster = cmd.ext_fields.get("cluster")
    routes = server.namesrv.routes
    brokers = set(routes.clusters.get(cluster, set())) if cluster is not None else set()
    local = server.config.brokerName if server.store is not None else None
    if local is not None and cluster == server.config.brokerClusterName:
        brokers.add(local)
    own_topics = _local_topics(server)
    table = _topic_table(server, own_topics)
    own = set(own_topics)
    topics: list[str] = []
    for broker in hash_map_order(sorted(brokers)):
        topics += [
            t
            for t in table
            if (t in own if broker == local else broker in routes.topics.get(t, {}))
        ]
    return cmd.response(ResponseCode.SUCCESS, body=_topic_list(dict.fromkeys(topics)))


def system_topics(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RouteInfoManager.getSystemTopicList: cluster and broker names, and a broker address."""
    names: list[str] = []
    clusters = _clusters(server)
    # clusterAddrTable (32 buckets), its sets of broker names
    for cluster in hash_map_order(clusters, 32):
        names += [cluster, *hash_map_order(sorted(clusters[cluster]))]
    addr = server.broker_addr or next(
        (a for e in server.namesrv.routes.brokers.values() for a in e.addrs.values()), None
    )
    extra = {"brokerAddr": addr} if addr else {}
    return cmd.response(ResponseCode.SUCCESS, body=_topic_list(names, **extra))


def unit_topics(flag: int, without: int) -> Handler:
    def handler(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
        local = server.store.topics.topics if server.store is not None else {}
        topics = []
        for name in _topic_table(server):
            cfg = local.get(name) if _routed(server, name) else None
            if cfg is not None:
                sys_flag = cfg.topicSysFlag
            else:  # RocketMQ reads one queue data of the topic
                first = next(iter(server.namesrv.routes.topics.get(name, {}).values()), None)
                if first is None:
                    continue
                sys_flag = first["topicSysFlag"]
            if sys_flag & flag and not sys_flag & without:
                topics.append(name)
        return cmd.response(ResponseCode.SUCCESS, body=_topic_list(topics))

    return handler


def _namesrv_settings(server: Broker) -> dict[str, str]:
    state = server.namesrv
    port = server.namesrv_addr.rpartition(":")[2]
    return {**namesrv_settings(port, str(state.path), str(state.config_path)), **state.settings}


def get_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    text = "".join(f"{k}={v}\n" for k, v in _namesrv_settings(server).items())
    return cmd.response(ResponseCode.SUCCESS, body=text.encode())


def update_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """As Configuration.update: only keys the nameserver has change (the value is
    reported, nothing rebinds), the paths cannot, and all of it is written to
    ``configStorePath``."""
    props = read_properties(cmd.body.decode("utf-8", errors="replace")) if cmd.body else {}
    if "kvConfigPath" in props or "configStorePath" in props:
        return cmd.response(ResponseCode.NO_PERMISSION, "Can not update config path")
    known = _namesrv_settings(server)
    for key, given in props.items():
        if key in known:  # as its typed field takes it; a number that does not parse: kept
            value = as_java_field(kind_of(known[key]), given)
            if value is not None:
                server.namesrv.settings[key] = value
    server.namesrv.persist_settings(_namesrv_settings(server))
    return cmd.response(ResponseCode.SUCCESS)
