"""The embedded nameserver: routes come straight from the broker's topic table.

Route JSON is written as a real nameserver writes it: bare integer map keys
(``{0:"ip:port"}``) unless the client is 4.9.4+ or asks for standard JSON.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import DEFAULT_TOPIC, Perm

from .config import read_properties
from .kvconfig import ORDER_TOPIC_CONFIG
from .rocketmq_defaults import namesrv_settings

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

V4_9_4 = 401
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def register(handlers: dict[int, Handler]) -> None:
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
    handlers[RequestCode.GET_UNIT_TOPIC_LIST] = unit_topics(UNIT, 0)
    handlers[RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST] = unit_topics(UNIT_SUB, 0)
    handlers[RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST] = unit_topics(UNIT_SUB, UNIT)
    handlers[RequestCode.GET_NAMESRV_CONFIG] = get_config
    handlers[RequestCode.UPDATE_NAMESRV_CONFIG] = update_config


UNIT, UNIT_SUB = 0x1, 0x2  # TopicSysFlag: unit topic, has unit subscription


def _dumps(obj: Any, standard: bool) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    if not standard:
        # fastjson's default for Map<Long, String>: the broker id key unquoted.
        text = text.replace('"brokerAddrs":{"0":', '"brokerAddrs":{0:')
    return text.encode()


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
    cmd.require("topic")
    assert server.store is not None
    topic = cmd.ext_fields["topic"]
    tcfg = server.store.topics.get(topic) if _routed(server, topic) else None
    if topic == DEFAULT_TOPIC and not server.config.autoCreateTopicEnable:
        tcfg = None
    if tcfg is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {topic}{FAQ}",
        )
    standard = cmd.version >= V4_9_4 or cmd.field_bool("acceptStandardJsonOnly")
    body: dict[str, Any] = {
        "brokerDatas": [_broker_data(server)],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": server.config.brokerName,
                "perm": _perm(server, tcfg.perm),
                "readQueueNums": tcfg.readQueueNums,
                "topicSysFlag": tcfg.topicSysFlag,
                "writeQueueNums": tcfg.writeQueueNums,
            }
        ],
    }
    # DefaultRequestProcessor.getRouteInfoByTopic reads the order config only with the
    # nameserver's orderMessageEnable (false by default; updateNamesrvConfig sets it)
    if server.namesrv.settings.get("orderMessageEnable", "").lower() == "true":
        order_conf = server.namesrv.get(ORDER_TOPIC_CONFIG, topic)
        if order_conf is not None:
            body["orderTopicConf"] = order_conf
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, standard))


def _perm(server: Broker, perm: int) -> int:
    perm &= server.config.brokerPermission | Perm.INHERIT | 8
    if server.config.brokerName in server.namesrv.write_wiped:
        perm &= ~Perm.WRITE
    return perm


def _routed(server: Broker, topic: str) -> bool:
    """False while a route deleted from the nameserver has not been registered again
    (the broker registers its topics again when its topic table changes)."""
    assert server.store is not None
    deleted_at = server.namesrv.deleted_routes.get(topic)
    return deleted_at is None or server.store.topics.version.counter > deleted_at


def cluster_info(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    body = {
        "brokerAddrTable": {server.config.brokerName: _broker_data(server)},
        "clusterAddrTable": {server.config.brokerClusterName: [server.config.brokerName]},
    }
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, cmd.version >= V4_9_4))


def topic_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    body = {"topicList": sorted(t for t in server.store.topics.topics if _routed(server, t))}
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, True))


def put_kv(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace, key = cmd.ext_fields.get("namespace"), cmd.ext_fields.get("key")
    if namespace is None or key is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "namespace or key is null")
    server.namesrv.put(namespace, key, cmd.ext_fields.get("value") or "")
    if namespace == ORDER_TOPIC_CONFIG:
        sync_order_topics(server)
    return cmd.response(ResponseCode.SUCCESS)


def sync_order_topics(server: Broker) -> None:
    """TopicConfigManager.updateOrderTopicConfig, which RocketMQ's broker runs with the
    KV table each registration answers: a topic is ``order`` exactly when the
    nameserver's ORDER_TOPIC_CONFIG names it (here at once, registration being local)."""
    assert server.store is not None
    ordered = server.namesrv.kv.get(ORDER_TOPIC_CONFIG)
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
    value = server.namesrv.get(namespace or "", key or "")
    if value is None:  # Java's string concatenation: an absent field reads "null"
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            f"No config item, Namespace: {_java_str(namespace)} Key: {_java_str(key)}",
        )
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"value": value})


def delete_kv(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace = cmd.ext_fields.get("namespace", "")
    server.namesrv.delete(namespace, cmd.ext_fields.get("key", ""))
    if namespace == ORDER_TOPIC_CONFIG:
        sync_order_topics(server)
    return cmd.response(ResponseCode.SUCCESS)


def kv_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    namespace = cmd.ext_fields.get("namespace")
    table = server.namesrv.kv.get(namespace or "")
    if table is None:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {_java_str(namespace)}"
        )
    return cmd.response(ResponseCode.SUCCESS, body=_dumps({"table": table}, True))


def _broker_topic_count(server: Broker, broker_name: str) -> int:
    assert server.store is not None
    if broker_name != server.config.brokerName:
        return 0
    return sum(1 for t in server.store.topics.topics if _routed(server, t))


def wipe_write_perm(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RouteInfoManager.wipeWritePermOfBrokerByLock: the broker's queues lose the write
    bit in every route; the answer counts the topics touched."""
    name = cmd.ext_fields.get("brokerName", "")
    count = _broker_topic_count(server, name)
    if count:
        server.namesrv.write_wiped.add(name)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"wipeTopicCount": str(count)})


def add_write_perm(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    name = cmd.ext_fields.get("brokerName", "")
    count = _broker_topic_count(server, name)
    server.namesrv.write_wiped.discard(name)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"addTopicCount": str(count)})


def delete_topic_route(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    cmd.require("topic")
    server.namesrv.deleted_routes[cmd.ext_fields["topic"]] = server.store.topics.version.counter
    return cmd.response(ResponseCode.SUCCESS)


def topics_by_cluster(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    cluster = cmd.ext_fields.get("cluster", "")
    topics: list[str] = []
    if cluster == server.config.brokerClusterName:
        topics = sorted(t for t in server.store.topics.topics if _routed(server, t))
    return cmd.response(ResponseCode.SUCCESS, body=_dumps({"topicList": topics}, True))


def system_topics(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RouteInfoManager.getSystemTopicList: cluster and broker names, and a broker address."""
    body = {
        "brokerAddr": server.broker_addr,
        "topicList": sorted({server.config.brokerClusterName, server.config.brokerName}),
    }
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, True))


def unit_topics(flag: int, without: int) -> Handler:
    def handler(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
        assert server.store is not None
        topics = sorted(
            name
            for name, cfg in server.store.topics.topics.items()
            if cfg.topicSysFlag & flag and not cfg.topicSysFlag & without and _routed(server, name)
        )
        return cmd.response(ResponseCode.SUCCESS, body=_dumps({"topicList": topics}, True))

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
    for key, value in props.items():
        if key in known:
            server.namesrv.settings[key] = value
    server.namesrv.persist_settings(_namesrv_settings(server))
    return cmd.response(ResponseCode.SUCCESS)
