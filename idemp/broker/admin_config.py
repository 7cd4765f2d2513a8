"""The broker's configuration over the wire: ``mqadmin getBrokerConfig`` and
``updateBrokerConfig``.

RocketMQ answers GET_BROKER_CONFIG with every setting as ``key=value`` lines and a
``version`` header (a DataVersion); UPDATE_BROKER_CONFIG takes ``key=value`` lines and
applies those it knows, dropping unknown keys and numbers that do not parse, reading a
boolean as Java's parseBoolean does (it still answers SUCCESS; idemp logs what it
ignored), and rewrites the broker's configuration file with the result. idemp
reports the settings it has and, for the rest of RocketMQ's, RocketMQ's defaults
(``rocketmq_defaults``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode

from . import rocketmq_defaults
from .config import (
    ENUM_SETTINGS,
    NOT_KEYS,
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
        if f.name not in NOT_KEYS and "system_property" not in f.metadata
    )
    items.update((name, _value(getattr(cfg, name))) for name in modelled)
    items.update(cfg.unknown)
    return items


def unheeded(cfg: BrokerConfig) -> list[str]:
    """The configuration file's keys idemp does not act on: RocketMQ's broker has none
    of that name, or it is one of RocketMQ's settings idemp only reports, set to other
    than RocketMQ's default. (A file updateBrokerConfig rewrote lists every setting,
    most at their defaults: those need no word.)"""
    defaults = dict(rocketmq_defaults.STATIC)
    defaults.update(rocketmq_defaults.derived(cfg.listenPort, cfg.storePathRootDir, cfg.brokerIP1))
    return [key for key, value in cfg.unknown.items() if defaults.get(key) != value]


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
        props = read_properties(text)
        for key, given in props.items():
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
            if "brokerPermission" in props:  # a new dataVersion; the whole table registered
                server.store.topics.changed()
        persist(server.config)
    return cmd.response(ResponseCode.SUCCESS)


def persist(cfg: BrokerConfig) -> None:
    """Configuration.persist: the file given with ``-c`` is rewritten with every setting
    (getBrokerConfig's lines), the one before kept as ``.bak``, so an update outlives a
    restart as on RocketMQ. A file that cannot be written (mounted read-only, say) keeps
    the new values until the restart, with a warning, as RocketMQ logs its failure."""
    if cfg.config_file is None:
        return
    path = Path(cfg.config_file)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(config_lines(cfg), encoding="utf-8")
        if path.exists():
            path.with_name(path.name + ".bak").write_bytes(path.read_bytes())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning("updateBrokerConfig: cannot rewrite %s (%s): until a restart only", path, exc)
