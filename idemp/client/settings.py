"""Tunables of idemp's client, with RocketMQ's (Java 4.9) defaults.

Plain dataclasses: every runner and tool builds them from keyword arguments or CLI
flags, and tests shorten intervals through them instead of patching constants.
Times are in seconds unless the name says ``_ms``.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from idemp.remoting import RemotingCommand
from idemp.remoting.acl import sign

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]+")


class MessageModel(str, Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(str, Enum):
    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class Allocation(str, Enum):
    AVERAGE = "AVERAGE"
    CONSISTENT_HASH = "CONSISTENT_HASH"


def local_ip() -> str:
    """The IPv4 address other hosts would see (no packet is sent: UDP connect only)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
            if ip and not ip.startswith("0."):
                return str(ip)
    except OSError:
        pass
    return "127.0.0.1"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class ClientSettings:
    """One per client instance (process): connections, routes, heartbeats."""

    namesrv_addr: str = field(default_factory=lambda: os.environ.get("NAMESRV_ADDR", ""))
    instance_name: str = "DEFAULT"
    # the Java client's namespace (ClientConfig.setNamespace): topics and groups go on the
    # wire as ``<namespace>%<name>``; listeners and send results see the names without it
    namespace: str = field(default_factory=lambda: os.environ.get("IDEMP_NAMESPACE", ""))
    client_ip: str = field(default_factory=local_ip)
    request_timeout: float = 3.0  # sync calls (ClientConfig / C++ default 3000 ms)
    connect_timeout: float = 3.0
    heartbeat_interval: float = 30.0
    route_refresh_interval: float = 30.0
    persist_offset_interval: float = 5.0
    rebalance_interval: float = 20.0  # Java 20 s; the C++ client uses 10 s
    # Version ordinal sent in every request: 4.9.7 (>= 401 gets standard route JSON).
    version: int = 407
    language: str = "PYTHON"
    # RocketMQ's plain ACL (a broker with aclEnable=true): with an access key every request
    # is signed, as the Java client's AclClientRPCHook signs it. From the environment when
    # not given, so runners, tools and the worker all pick them up.
    access_key: str = field(default_factory=lambda: os.environ.get("IDEMP_ACCESS_KEY", ""))
    secret_key: str = field(
        default_factory=lambda: os.environ.get("IDEMP_SECRET_KEY", ""), repr=False
    )
    security_token: str = field(
        default_factory=lambda: os.environ.get("IDEMP_SECURITY_TOKEN", ""), repr=False
    )

    # TLS to the nameserver and brokers (the Java client's useTLS, -Dtls.enable=true).
    # Without a CA file any server certificate is taken, as RocketMQ's clients take one in
    # their default test mode (tls.test.mode.enable); with one, the chain must lead to it
    # (host names are not checked: brokers are reached by the addresses they advertise).
    use_tls: bool = field(default_factory=lambda: _env_flag("IDEMP_USE_TLS"))
    tls_ca_file: str = field(default_factory=lambda: os.environ.get("IDEMP_TLS_CA_FILE", ""))
    # a client certificate, for servers with tls.server.need.client.auth=require
    tls_cert_file: str = field(default_factory=lambda: os.environ.get("IDEMP_TLS_CERT_FILE", ""))
    tls_key_file: str = field(default_factory=lambda: os.environ.get("IDEMP_TLS_KEY_FILE", ""))

    def __post_init__(self) -> None:
        if self.namespace and not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r}: letters, digits, '_' and '-' only "
                "(ClientSettings, or IDEMP_NAMESPACE)"
            )
        if bool(self.access_key) != bool(self.secret_key):
            given, missing = (
                ("access_key", "secret_key") if self.access_key else ("secret_key", "access_key")
            )
            raise ValueError(
                f"ACL credentials: {given} is set but {missing} is not "
                "(ClientSettings, or IDEMP_ACCESS_KEY and IDEMP_SECRET_KEY)"
            )
        if self.security_token and not self.access_key:
            raise ValueError("ACL credentials: security_token is set without an access_key")

    def signer(self) -> Callable[[RemotingCommand], None] | None:
        """What signs each request of a client with these settings; None without ACL."""
        if not self.access_key:
            return None
        ak, sk, token = self.access_key, self.secret_key, self.security_token or None
        return lambda cmd: sign(cmd, ak, sk, token)

    def tls_context(self) -> ssl.SSLContext | None:
        """The client side of TLS; None without ``use_tls``. Files that do not load are
        an error here, when a client starts."""
        if not self.use_tls:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        try:
            if self.tls_ca_file:
                ctx.load_verify_locations(self.tls_ca_file)
            else:
                ctx.verify_mode = ssl.CERT_NONE
            if self.tls_cert_file:
                ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS files of the client settings: {exc}") from None
        return ctx

    def security(self) -> tuple[object, ...]:
        """What a client instance's connections are made with: ACL and TLS."""
        return (
            self.access_key,
            self.secret_key,
            self.security_token,
            self.use_tls,
            self.tls_ca_file,
            self.tls_cert_file,
            self.tls_key_file,
        )

    def client_id(self) -> str:
        """``ip@pid`` plus ``#instance`` when named (like the Java client)."""
        base = f"{self.client_ip}@{os.getpid()}"
        return base if self.instance_name == "DEFAULT" else f"{base}#{self.instance_name}"


@dataclass
class ProducerSettings:
    group: str = "DEFAULT_PRODUCER"
    send_timeout: float = 3.0
    retry_times_when_send_failed: int = 2  # Java: 3 attempts in all
    compress_over: int = 4096
    max_message_size: int = 4 * 1024 * 1024
    default_topic_queue_nums: int = 4
    create_topic_key: str = "TBW102"
    # Transactional producers: seconds between unanswered half message checks is broker-side.
    check_thread_pool_size: int = 1
    # the Java client's enableMsgTrace and customizedTraceTopic (trace.py)
    enable_trace: bool = False
    trace_topic: str = "RMQ_SYS_TRACE_TOPIC"


@dataclass
class ConsumerSettings:
    group: str = "DEFAULT_CONSUMER"
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET
    consume_timestamp_ms: int | None = None  # None = 30 minutes before start (Java)
    allocation: Allocation = Allocation.AVERAGE
    consume_thread_count: int = 20  # consumeThreadMin/Max
    consume_batch_size: int = 1  # consumeMessageBatchMaxSize
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000  # cached messages per queue
    pull_threshold_size_for_queue_mb: int = 100
    pull_time_delay_when_flow_control: float = 0.05
    consume_concurrently_max_span: int = 2000  # concurrent only: offsets cached, oldest→newest
    pull_time_delay_when_exception: float = 3.0
    suspend_timeout_ms: int = 15_000  # broker long-poll hold
    pull_timeout: float = 30.0
    max_reconsume_times: int = 16  # -1: Java's defaults, forever (orderly) or 16
    send_back_retry_delay: float = 5.0
    # concurrent: the delay level of a failed message's send-back (Java's
    # delayLevelWhenNextConsume); 0 = the broker's schedule, level 3 + reconsume times
    retry_delay_level: int = 0
    # concurrent: a message whose listener runs longer is sent back and its offset passed
    # (Java's consumeTimeout); both runners: how long a shutdown waits for listeners
    consume_timeout_minutes: float = 15.0
    # Orderly (ConsumeMessageOrderlyService / RebalanceImpl / ProcessQueue)
    lock_renew_interval: float = 20.0  # REBALANCE_LOCK_INTERVAL
    lock_expiry: float = 30.0  # REBALANCE_LOCK_MAX_LIVE_TIME (client side)
    suspend_current_queue_time: float = 1.0  # suspendCurrentQueueTimeMillis
    max_time_consume_continuously: float = 60.0  # MAX_TIME_CONSUME_CONTINUOUSLY
    drop_consume_lock_timeout: float = 1.0  # tryLock(1000 ms) before dropping a queue
    lock_retry_delay: float = 0.1  # tryLockLaterAndReconsume (Java: 10 ms / 3 s)
    # Offsets
    offset_store_dir: str | None = None  # broadcasting: default ~/.rocketmq_offsets
    commit_offset_each_batch: bool = False  # orderly: push the offset after every batch
    # the Java client's enableMsgTrace and customizedTraceTopic (trace.py)
    enable_trace: bool = False
    trace_topic: str = "RMQ_SYS_TRACE_TOPIC"

    def effective_max_reconsume(self, orderly: bool) -> int:
        """-1 is Java's default: forever for an orderly consumer, 16 for a concurrent one
        (ConsumeMessageOrderlyService / DefaultMQPushConsumerImpl.getMaxReconsumeTimes)."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return 2**31 - 1 if orderly else 16
