"""A nameserver's route of a topic (TopicRouteData), as the broker and the client read it.

RocketMQ's nameserver writes ``brokerAddrs`` with fastjson's bare integer keys
(``{0:"ip:port"}``) unless asked for standard JSON; both are read here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import jsonlenient


class RouteBody(NamedTuple):
    brokers: dict[str, dict[int, str]]  # broker name -> broker id -> address
    queue_datas: list[dict[str, Any]]
    order_topic_conf: str | None


def parse_route(body: bytes) -> RouteBody:
    """Raises ValueError when ``body`` is not JSON."""
    data = jsonlenient.loads(body)
    brokers = {
        str(bd.get("brokerName")): {
            int(k): str(v) for k, v in (bd.get("brokerAddrs") or {}).items()
        }
        for bd in data.get("brokerDatas") or []
    }
    return RouteBody(brokers, list(data.get("queueDatas") or []), data.get("orderTopicConf"))
