"""The nameserver's own state: its KV config, the brokers' write permission and the
routes of the brokers that registered with it.

RocketMQ's nameserver keeps a namespace → key → value table (KVConfigManager, persisted
in ``kvConfig.json``): ``ORDER_TOPIC_CONFIG`` holds a topic's order configuration, which
the route of that topic then carries. ``wipeWritePerm``/``addWritePerm`` change the
write bit of a broker's queues in the routes, not the broker's topic configs.
"""

from __future__ import annotations

from pathlib import Path

from .jsonfile import read_json, write_json
from .routes import RouteTable

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG


class NamesrvState:
    def __init__(self, path: Path) -> None:
        self.path = path
        # a PUT without a value keeps the key with None, as RocketMQ's HashMap keeps a
        # null: the namespace exists, the key reads as absent and is never written out
        self.kv: dict[str, dict[str, str | None]] = {}
        data = read_json(path)
        if data:
            for ns, table in (data.get("configTable") or {}).items():
                self.kv[str(ns)] = {str(k): str(v) for k, v in dict(table).items()}
        # this broker's topics whose route perm the nameserver set itself (wipe/add write
        # perm): topic -> (the topic's config then, the perm); RocketMQ's nameserver keeps
        # it until the broker registers that topic again (a new config replaces the object)
        self.route_perm: dict[str, tuple[object, int]] = {}
        # the broker's topic table version those perms hold for: a registration of the
        # whole table with a newer version (RouteInfoManager.registerBroker) rewrites
        # every topic's queue data, and so the perms set here
        self.route_perm_version = -1
        # topic -> the broker's topic table version when its route was deleted here
        self.deleted_routes: dict[str, int] = {}
        # NamesrvConfig + NettyServerConfig values changed by UPDATE_NAMESRV_CONFIG
        self.settings: dict[str, str] = {}
        self.config_path = path.with_name("namesrv.properties")
        self.routes = RouteTable()  # brokers registered by REGISTER_BROKER

    def put(self, namespace: str, key: str, value: str | None) -> None:
        self.kv.setdefault(namespace, {})[key] = value
        self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.kv.get(namespace, {}).get(key)

    def table(self, namespace: str) -> dict[str, str] | None:
        """A namespace as RocketMQ's answers (fastjson) write it: null values left out;
        None when there is no such namespace."""
        table = self.kv.get(namespace)
        if table is None:
            return None
        return {k: v for k, v in table.items() if v is not None}

    def delete(self, namespace: str, key: str) -> None:
        table = self.kv.get(namespace)  # an emptied namespace stays, as in RocketMQ
        if table is not None and key in table:
            del table[key]
            self._persist()

    def persist_settings(self, settings: dict[str, str]) -> None:
        """Configuration.persist: every setting, as MixAll.properties2String writes them."""
        text = "".join(f"{k}={v}\n" for k, v in settings.items())
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.config_path)

    def _persist(self) -> None:
        write_json(self.path, {"configTable": {ns: self.table(ns) for ns in self.kv}})
