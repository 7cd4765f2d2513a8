"""The broker's configuration over the wire: ``mqadmin getBrokerConfig`` and
``updateBrokerConfig``.

RocketMQ answers GET_BROKER_CONFIG with every setting as ``key=value`` lines and a
``version`` header (a DataVersion); UPDATE_BROKER_CONFIG takes ``key=value`` lines and
applies those it knows, dropping unknown keys and numbers that do not parse, reading a
boolean as Java's parseBoolean does (it still answers SUCCESS; idemp logs what it
ignored). idemp reports the settings it has and, for the rest of RocketMQ's, RocketMQ's
defaults (``rocketmq_defaults``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode

from . import rocketmq_defaults
from .config import (
    ENUM_SETTINGS,
    ConfigError,
    apply_setting,
    as_java_field,
    kind_of,
    read_properties,
    setting_type,
)

if TYPE_CHECKING:
    from .config import BrokerConfig
    from .context import Broker, Handler, Peer

log = logging.getLogger("idemp.broker.admin")


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.GET_BROKER_CONFIG] = get_config
    handlers[RequestCode.UPDATE_BROKER_CONFIG] = update_config


_BODY_RANK = {key: i for i, key in enumerate(rocketmq_defaults.BODY_ORDER)}


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _reported(cfg: BrokerConfig) -> dict[str, str]:
    """RocketMQ's whole set of settings: what idemp does not model at RocketMQ's
    defaults, what it models as set, and the keys of the configuration file."""
    items = dict(rocketmq_defaults.STATIC)
    items.update(rocketmq_defaults.derived(cfg.listenPort, cfg.storePathRootDir, cfg.brokerIP1))
    modelled = (
        f.name
        for f in dataclasses.fields(cfg)
        if f.name != "unknown" and "system_property" not in f.metadata
    )
    items.update((name, _value(getattr(cfg, name))) for name in modelled)
    items.update(cfg.unknown)
    return items


def config_lines(cfg: BrokerConfig) -> str:
    """Configuration.getAllConfigsFormatString: one ``key=value`` per line."""
    # RocketMQ's keys in its broker's order (mqadmin prints them as on RocketMQ), then ours
    ordered = sorted(_reported(cfg).items(), key=lambda kv: _BODY_RANK.get(kv[0], len(_BODY_RANK)))
    return "".join(f"{k}={v}\n" for k, v in ordered)


def get_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    version = {"counter": server.config_version, "timestamp": int(time.time() * 1000)}
    return cmd.response(
        ResponseCode.SUCCESS,
        ext_fields={"version": json.dumps(version, separators=(",", ":"))},
        body=config_lines(server.config).encode(),
    )


def _as_rocketmq_takes_it(cfg: BrokerConfig, key: str, raw: str) -> str | None:
    """Configuration.update: a key none of its config objects has is dropped
    (mergeIfExist); a value as its typed field takes it (None: left as it was)."""
    names = ENUM_SETTINGS.get(key)
    if names is not None:  # a String setter calling Enum.valueOf, which throws on others
        return raw if raw in names else None
    kind = setting_type(key)
    if kind is None:
        current = _reported(cfg).get(key)
        if current is None:
            return None
        kind = kind_of(current)
    return as_java_field(kind, raw)


def update_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    if cmd.body:
        text = cmd.body.decode("utf-8", errors="replace")
        for key, given in read_properties(text).items():
            raw = _as_rocketmq_takes_it(server.config, key, given)
            if raw is None:
                log.warning("updateBrokerConfig from %s: ignored %s=%s", conn.peer, key, given)
                continue
            try:
                apply_setting(server.config, key, raw)
            except ConfigError as exc:
                log.warning("updateBrokerConfig from %s: ignored %s", conn.peer, exc)
                continue
            log.info("updateBrokerConfig from %s: %s=%s", conn.peer, key, raw)
        server.config_version += 1
        if server.store is not None:  # a new diskSpaceWarningLevelRatio applies at once
            server.store.disk.check()
    return cmd.response(ResponseCode.SUCCESS)
