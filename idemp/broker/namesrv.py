"""The embedded nameserver: routes come straight from the broker's topic table.

Route JSON is written as a real nameserver writes it: bare integer map keys
(``{0:"ip:port"}``) unless the client is 4.9.4+ or asks for standard JSON.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import DEFAULT_TOPIC

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

V4_9_4 = 401
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.GET_ROUTEINFO_BY_TOPIC] = route_info
    handlers[RequestCode.GET_BROKER_CLUSTER_INFO] = cluster_info
    handlers[RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER] = topic_list


def _dumps(obj: Any, standard: bool) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    if not standard:
        # fastjson's default for Map<Long, String>: the broker id key unquoted.
        text = text.replace('"brokerAddrs":{"0":', '"brokerAddrs":{0:')
    return text.encode()


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
    tcfg = server.store.topics.get(topic)
    if topic == DEFAULT_TOPIC and not server.config.autoCreateTopicEnable:
        tcfg = None
    if tcfg is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {topic}{FAQ}",
        )
    standard = cmd.version >= V4_9_4 or cmd.field_bool("acceptStandardJsonOnly")
    body = {
        "brokerDatas": [_broker_data(server)],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": server.config.brokerName,
                "perm": tcfg.perm & (server.config.brokerPermission | 1 | 8),
                "readQueueNums": tcfg.readQueueNums,
                "topicSysFlag": tcfg.topicSysFlag,
                "writeQueueNums": tcfg.writeQueueNums,
            }
        ],
    }
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, standard))


def cluster_info(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    body = {
        "brokerAddrTable": {server.config.brokerName: _broker_data(server)},
        "clusterAddrTable": {server.config.brokerClusterName: [server.config.brokerName]},
    }
    return cmd.response(ResponseCode.SUCCESS, body=_dumps(body, cmd.version >= V4_9_4))


def topic_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    body = {"topicList": sorted(server.store.topics.topics)}
    return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())
