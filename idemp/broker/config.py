"""Broker configuration, read from a RocketMQ ``broker.conf`` (Java properties format).

A user's existing file must work: known keys are applied, unknown ones produce one
warning each and are otherwise ignored.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_GRPC_PORT = 8081
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def _sysprop(name: str) -> dict[str, str]:
    return {"system_property": name}


@dataclass
class BrokerConfig:
    brokerClusterName: str = "DefaultCluster"
    brokerName: str = "broker-a"
    brokerId: int = 0
    brokerIP1: str = "127.0.0.1"
    listenPort: int = 10911
    namesrvAddr: str = "127.0.0.1:9876"
    storePathRootDir: str = "store"
    autoCreateTopicEnable: bool = True
    autoCreateSubscriptionGroup: bool = True
    defaultTopicQueueNums: int = 8
    messageDelayLevel: str = DEFAULT_DELAY_LEVELS
    maxMessageSize: int = 4 * 1024 * 1024
    flushDiskType: str = "ASYNC_FLUSH"
    flushIntervalCommitLog: int = 500
    syncFlushTimeout: int = 5000
    transactionCheckInterval: int = 60_000
    # idemp's: RocketMQ 5.3.3's transactionCheckInterval, for the halves 5.x clients send
    # through the gRPC endpoint (4.x halves keep 4.9.7's transactionCheckInterval)
    grpcTransactionCheckInterval: int = 30_000
    transactionTimeOut: int = 6_000
    transactionCheckMax: int = 15
    rejectTransactionMessage: bool = False
    longPollingEnable: bool = True
    shortPollingTimeMills: int = 1000
    flushConsumerOffsetInterval: int = 5000
    brokerPermission: int = 6
    regionId: str = "DefaultRegion"
    traceOn: bool = True
    maxTransferCountOnMessageInMemory: int = 32
    maxTransferBytesOnMessageInMemory: int = 256 * 1024
    # RocketMQ: system property rocketmq.broker.rebalance.lockMaxLiveTime (queue lock expiry)
    rebalanceLockMaxLiveTime: int = 60_000
    # false: consumers are never told their group changed (they rebalance on their timer)
    notifyConsumerIdsChangedEnable: bool = True
    # idemp-only: false runs no nameserver in this process; the broker then registers
    # with the nameservers of namesrvAddr (``a:9876;b:9876``) as RocketMQ's broker does
    embeddedNamesrv: bool = True
    # RocketMQ's registration: every registerNameServerPeriod ms (kept within 10-60 s),
    # at once when a topic changes; forceRegister=false asks QUERY_DATA_VERSION first
    registerNameServerPeriod: int = 30_000
    registerBrokerTimeoutMills: int = 6000
    compressedRegister: bool = False
    forceRegister: bool = True
    # the broker's own topic for message traces (created at start when enabled)
    traceTopicEnable: bool = False
    msgTraceTopicName: str = "RMQ_SYS_TRACE_TOPIC"
    # idemp-only: where the process binds. RocketMQ binds every interface; idemp binds
    # loopback unless told otherwise, since it is a test double.
    bindAddress: str = "127.0.0.1"
    # RocketMQ's plain ACL (see acl.py). aclPlainFile is idemp's key for the file's path
    # (RocketMQ: $ROCKETMQ_HOME/conf/plain_acl.yml, system property rocketmq.acl.plain.file).
    aclEnable: bool = False
    aclPlainFile: str = ""
    # RocketMQ 5's gRPC endpoint (the proxy's grpcServerPort): 0 picks a free port, -1
    # turns it off. A broker on a free port (listenPort=0, as tests start it) takes a free
    # gRPC port too instead of the default 8081, so two such brokers never collide.
    grpcServerPort: int = DEFAULT_GRPC_PORT
    # the proxy's minInvisibleTimeMillsForRecv: a receive asking less is refused (40011)
    minInvisibleTimeMillsForRecv: int = 10_000
    # RocketMQ 5's broker: the percentage of POP receives that read the retry topic
    # before the topic's own queues (the rest read it only to fill the batch)
    popFromRetryProbability: int = 20
    # the proxy's: how long a 5.x half message's transaction data is kept for its
    # EndTransaction ("cannot found transaction data" after; the check-back resolves it)
    transactionDataExpireMillis: int = 30_000
    # the proxy's: a 5.x client's connection without a call for this long gets a GOAWAY
    # and is closed (grpc-java's maxConnectionIdle); its next call reconnects
    grpcClientIdleTimeMills: int = 120_000
    # SQL92 subscriptions (MessageSelector.bySql) are served only when true, as RocketMQ
    enablePropertyFilter: bool = False
    # RocketMQ 5's: topics of message.type MIXED are refused unless this is true
    enableMixedMessageType: bool = False
    # RocketMQ 5.3's: RecallMessage (a delayed message cancelled before it is due) is
    # refused unless this is true ("recall failed, operation is forbidden")
    recallMessageEnable: bool = False
    # RocketMQ 5's MessageStoreConfig key (4.9.7: the system property
    # rocketmq.broker.diskSpaceWarningLevelRatio, as a fraction): over this percentage of
    # the commit log's disk in use, producers' writes are refused (diskguard.py)
    diskSpaceWarningLevelRatio: int = 90
    # TLS on the remoting ports (tls.py). RocketMQ 4.9 reads these as JVM system
    # properties, not broker.conf keys: idemp takes them by those names in broker.conf or
    # -p, and leaves them out of GET_BROKER_CONFIG as RocketMQ does.
    tlsServerMode: str = field(default="permissive", metadata=_sysprop("tls.server.mode"))
    tlsTestModeEnable: bool = field(default=True, metadata=_sysprop("tls.test.mode.enable"))
    tlsServerCertPath: str = field(default="", metadata=_sysprop("tls.server.certPath"))
    tlsServerKeyPath: str = field(default="", metadata=_sysprop("tls.server.keyPath"))
    tlsServerKeyPassword: str = field(
        default="", repr=False, metadata=_sysprop("tls.server.keyPassword")
    )
    tlsServerTrustCertPath: str = field(default="", metadata=_sysprop("tls.server.trustCertPath"))
    tlsServerNeedClientAuth: str = field(
        default="none", metadata=_sysprop("tls.server.need.client.auth")
    )

    @property
    def grpc_port(self) -> int:
        """The gRPC port to bind (0: any free one, -1: none)."""
        if self.listenPort == 0 and self.grpcServerPort == DEFAULT_GRPC_PORT:
            return 0
        return self.grpcServerPort

    unknown: dict[str, str] = field(default_factory=dict)
    # the file it was read from (``-c``), which updateBrokerConfig rewrites; not a key
    config_file: str | None = None

    # --- derived values ---------------------------------------------------------
    @property
    def namesrv_host_port(self) -> tuple[str, int]:
        first = self.namesrvAddr.split(";")[0].strip()
        host, _, port = first.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"namesrvAddr {self.namesrvAddr!r} is not host:port")
        return host, int(port)

    @property
    def namesrv_addrs(self) -> list[str]:
        """Every nameserver of ``namesrvAddr``, the ones a broker without its own
        registers with."""
        out = []
        for item in filter(None, (a.strip() for a in self.namesrvAddr.split(";"))):
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"namesrvAddr {self.namesrvAddr!r}: {item!r} is not host:port")
            out.append(item)
        if not out:
            raise ConfigError("namesrvAddr is empty")
        return out

    @property
    def sync_flush(self) -> bool:
        return self.flushDiskType.upper() == "SYNC_FLUSH"

    @property
    def delay_levels_ms(self) -> list[int]:
        return parse_delay_levels(self.messageDelayLevel)

    def with_overrides(self, values: dict[str, str]) -> BrokerConfig:
        cfg = dataclasses.replace(self, unknown=dict(self.unknown))
        for key, raw in values.items():
            apply_setting(cfg, key, raw)
        return cfg


NOT_KEYS = ("unknown", "config_file")
_FIELDS = {f.name: f for f in dataclasses.fields(BrokerConfig) if f.name not in NOT_KEYS}
# fields RocketMQ reads as system properties, by the property's name
SYSTEM_PROPERTIES = {
    f.metadata["system_property"]: f for f in _FIELDS.values() if "system_property" in f.metadata
}


def parse_delay_levels(text: str) -> list[int]:
    levels: list[int] = []
    for token in text.split():
        m = re.fullmatch(r"(\d+)([smhd])", token)
        if not m:
            raise ConfigError(f"messageDelayLevel: {token!r} is not a number followed by s/m/h/d")
        levels.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not levels:
        raise ConfigError("messageDelayLevel is empty")
    return levels


# MessageStoreConfig's enum settings: their String setters call valueOf, so at run time
# (updateBrokerConfig) a value that names none of these leaves the setting as it was
ENUM_SETTINGS = {
    "flushDiskType": ("SYNC_FLUSH", "ASYNC_FLUSH"),
    "brokerRole": ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
}


def setting_type(key: str) -> object | None:
    """The type of a setting idemp models (int, bool or str), None for the others."""
    f = SYSTEM_PROPERTIES.get(key) or _FIELDS.get(key)
    if f is None:
        return None
    return (
        {"int": int, "bool": bool, "str": str}.get(f.type, f.type)
        if isinstance(f.type, str)
        else f.type
    )


def kind_of(value: str) -> type:
    """The type of a RocketMQ setting that idemp only reports, read from its value."""
    if value in ("true", "false"):
        return bool
    return int if _is_int(value) else str


def as_java_field(kind: object, raw: str) -> str | None:
    """``raw`` as RocketMQ's MixAll.properties2Object sets a field of that type: a
    boolean is Boolean.parseBoolean's (anything but "true" is false), a number that does
    not parse leaves the field as it was (None)."""
    if kind is bool:
        return "true" if raw.strip().lower() == "true" else "false"
    if kind is int:
        return raw.strip() if _is_int(raw.strip()) else None
    return raw


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def apply_setting(cfg: BrokerConfig, key: str, raw: str) -> None:
    f = SYSTEM_PROPERTIES.get(key) or _FIELDS.get(key)
    if f is None:
        cfg.unknown[key] = raw
        return
    value: object
    if f.type in ("int", int):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{key}: {raw!r} is not an integer") from None
    elif f.type in ("bool", bool):
        low = raw.strip().lower()
        if low not in ("true", "false"):
            raise ConfigError(f"{key}: {raw!r} is not true or false")
        value = low == "true"
    else:
        value = raw.strip()
    setattr(cfg, f.name, value)


def read_properties(text: str) -> dict[str, str]:
    """Java .properties, the subset broker.conf files use: key=value or key: value,
    # and ! comments, blank lines, trailing-backslash continuation."""
    out: dict[str, str] = {}
    logical: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped[0] in "#!"):
            continue
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            logical.append(stripped[:-1])
            continue
        logical.append(stripped)
        full = "".join(logical)
        logical = []
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", full)
        if m:
            out[m.group(1)] = m.group(2)
        else:
            out[full] = ""
    return out


def load_config(path: str | Path | None, overrides: dict[str, str] | None = None) -> BrokerConfig:
    cfg = BrokerConfig()
    values: dict[str, str] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
        values.update(read_properties(text))
    values.update(overrides or {})
    cfg = cfg.with_overrides(values)
    cfg.config_file = None if path is None else str(path)
    validate(cfg)
    return cfg


def validate(cfg: BrokerConfig) -> None:
    cfg.namesrv_host_port  # noqa: B018 - raises ConfigError when malformed
    cfg.namesrv_addrs  # noqa: B018 - the same for each of them
    parse_delay_levels(cfg.messageDelayLevel)
    if cfg.flushDiskType.upper() not in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        raise ConfigError(f"flushDiskType: {cfg.flushDiskType!r} is not SYNC_FLUSH or ASYNC_FLUSH")
    for key in ("listenPort",):
        port = getattr(cfg, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{key}: {port} is not a TCP port")
    if not -1 <= cfg.grpcServerPort <= 65535:
        raise ConfigError(f"grpcServerPort: {cfg.grpcServerPort} is not a TCP port (or -1: off)")
    if cfg.grpcClientIdleTimeMills <= 0:
        raise ConfigError(f"grpcClientIdleTimeMills: {cfg.grpcClientIdleTimeMills} is not positive")
    if cfg.defaultTopicQueueNums <= 0:
        raise ConfigError("defaultTopicQueueNums must be positive")
    if cfg.maxMessageSize <= 0:
        raise ConfigError("maxMessageSize must be positive")
