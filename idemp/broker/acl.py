"""Optional access control compatible with RocketMQ 4.9's plain ACL (``aclEnable=true``).

The account file is RocketMQ's ``plain_acl.yml``; what each request needs and the
order of the checks follow ``PlainAccessValidator.parse`` and
``PlainPermissionManager.validate`` of RocketMQ 4.9.7, so a file and a client that
work with RocketMQ work here and vice versa. Secrets never leave this module: they are
not part of any ``repr``, log line or error text.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemp.remoting import RemotingCommand, RequestCode, jsonlenient
from idemp.remoting.acl import ACCESS_KEY, SIGNATURE, signature

from .config import BrokerConfig, ConfigError

log = logging.getLogger(__name__)

# Permission bits of org.apache.rocketmq.acl.common.Permission
DENY, ANY, PUB, SUB = 1, 2, 4, 8
_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
# Permission.ADMIN_CODE: UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG,
# DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP
ADMIN_CODES = frozenset({17, 25, 215, 200, 207})
# ACL changes and the account list (secrets included) need an admin account here; RocketMQ
# 4.9.7 lets any signed account send them (acl_admin.py)
ACL_ADMIN_CODES = frozenset({50, 51, 53, 54})
RETRY_PREFIX = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
# RocketMQ's broker leaves AclException to NettyRemotingAbstract, which answers
# SYSTEM_ERROR with the exception's toString(); clients see this prefix.
EXCEPTION_PREFIX = "org.apache.rocketmq.acl.common.AclException: "
_MIN_KEY_LEN = 6  # AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH


# NettyRemotingAbstract answers with exceptionSimpleDesc: the exception's text, then the
# first frame of its stack, i.e. where RocketMQ 4.9.7 throws it
_VALIDATE = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:{})"
)
_CHECK_PERM = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:{})"
)
_PARSE = "org.apache.rocketmq.acl.plain.PlainAccessValidator.parse(PlainAccessValidator.java:134)"


class AclDenied(Exception):
    """A request the ACL refuses; the text is what RocketMQ says (never a secret), and
    ``frame`` the place in RocketMQ that says it."""

    def __init__(self, message: str, access_key: str | None, frame: str) -> None:
        super().__init__(message)
        self.access_key = access_key
        self.frame = frame

    def remark(self) -> str:
        """The refusal's remark, as RocketMQ's remoting layer writes it."""
        return f"{EXCEPTION_PREFIX}{self}, {self.frame}"


AddressMatcher = Callable[[str], bool]


def parse_address_pattern(pattern: str | None) -> AddressMatcher:
    """RemoteAddressStrategyFactory: blank matches nothing, ``*`` everything, then
    ``a.b.c.{1,2}``, ``a,b``, ``a.b.*``/``a.b.1-5`` (IPv4) or one address."""
    text = (pattern or "").strip()
    if not text:
        return lambda addr: False
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return lambda addr: True
    if text.endswith("}"):
        head, sep, tail = text.rpartition("{")
        if not sep:
            raise ConfigError(f"plain_acl.yml: bad address pattern {text!r}")
        addrs = [head + part.strip() for part in tail[:-1].split(",")]
        return _exact_set(addrs, text)
    if "," in text:
        return _exact_set([a.strip() for a in text.split(",")], text)
    if "*" in text or "-" in text:
        return _ipv4_range(text)
    return _exact_set([text], text)


def _normal(addr: str) -> str | None:
    try:
        return str(ipaddress.ip_address(addr.strip()))
    except ValueError:
        return None


def _exact_set(addrs: list[str], pattern: str) -> AddressMatcher:
    wanted = set()
    for a in addrs:
        n = _normal(a)
        if n is None:
            raise ConfigError(f"plain_acl.yml: {a!r} in {pattern!r} is not an IP address")
        wanted.add(n)
    return lambda addr: _normal(addr) in wanted


def _ipv4_range(pattern: str) -> AddressMatcher:
    parts = pattern.split(".")
    if len(parts) != 4:
        raise ConfigError(f"plain_acl.yml: {pattern!r}: ranges are supported for IPv4 only")
    ranges: list[tuple[int, int]] = []
    for part in parts:
        p = part.strip()
        try:
            if p == "*":
                lo, hi = 0, 255
            elif "-" in p:
                a, _, b = p.partition("-")
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(p)
        except ValueError:
            raise ConfigError(f"plain_acl.yml: bad address pattern {pattern!r}") from None
        if not 0 <= lo <= hi <= 255:
            raise ConfigError(f"plain_acl.yml: bad range {p!r} in {pattern!r}")
        ranges.append((lo, hi))

    def match(addr: str) -> bool:
        try:
            ip = ipaddress.IPv4Address(addr.strip())
        except ValueError:
            return False
        octets = ip.packed
        return all(lo <= o <= hi for o, (lo, hi) in zip(octets, ranges))

    return match


def parse_perm(text: object) -> int:
    """Permission.parsePermFromString: absent or unknown means DENY."""
    if text is None:
        return DENY
    return _PERMS.get(str(text).strip(), DENY)


@dataclass
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    white: AddressMatcher = field(repr=False)
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    # topic name or %RETRY%<group> -> permission bits, as RocketMQ keys them
    perms: dict[str, int] = field(default_factory=dict)


@dataclass
class PlainAcl:
    accounts: dict[str, Account]
    global_white: list[AddressMatcher] = field(default_factory=list)
    path: str = ""
    # DataVersion (counter, timestamp ms): the file's ``dataVersion``, else 0 at load time
    version: tuple[int, int] = (0, 0)

    def check(self, cmd: RemotingCommand, peer_host: str) -> None:
        """Raise AclDenied unless ``cmd`` from ``peer_host`` may proceed
        (PlainPermissionManager.validate, in its order)."""
        needed = required_perms(cmd)
        if any(m(peer_host) for m in self.global_white):
            return
        ak = cmd.ext_fields.get(ACCESS_KEY)
        if ak is None:
            raise AclDenied("No accessKey is configured", None, _VALIDATE.format(663))
        owned = self.accounts.get(ak)
        if owned is None:
            raise AclDenied(f"No acl config for {ak}", ak, _VALIDATE.format(667))
        if owned.white(peer_host):
            return
        expected = signature(cmd, owned.secret_key)
        given = cmd.ext_fields.get(SIGNATURE) or ""
        if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
            raise AclDenied(f"Check signature failed for accessKey={ak}", ak, _VALIDATE.format(683))
        if needed.get(TRACE_TOPIC) == PUB:
            return
        if (cmd.code in ADMIN_CODES or cmd.code in ACL_ADMIN_CODES) and not owned.admin:
            raise AclDenied(
                f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not",
                ak,
                _CHECK_PERM.format(580),
            )
        if not needed or (owned.admin and not owned.perms):
            return
        for resource, need in needed.items():
            is_group = resource.startswith(RETRY_PREFIX)
            have = owned.perms.get(resource)
            line = 610  # the resource's own permission; 605: the account's default one
            if have is None:
                have = owned.default_group_perm if is_group else owned.default_topic_perm
                line = 605
            if not _permits(need, have):
                what = f"group:{resource[len(RETRY_PREFIX) :]}" if is_group else f"topic:{resource}"
                raise AclDenied(f"No default permission for {what}", ak, _CHECK_PERM.format(line))


def _permits(need: int, have: int) -> bool:
    """Permission.checkPermission."""
    if have & DENY:
        return False
    if need & ANY:
        return bool(have & (PUB | SUB))
    return bool(need & have)


def _retry(group: str | None) -> str | None:
    return None if group is None else RETRY_PREFIX + group


def required_perms(cmd: RemotingCommand) -> dict[str, int]:
    """PlainAccessValidator.parse: the resources (topics, and groups as %RETRY%<group>)
    a request touches and the permission each needs. Codes not listed need none."""
    f = cmd.ext_fields.get
    out: dict[str, int] = {}

    def add(resource: str | None, perm: int) -> None:
        if resource is not None:
            out[resource] = perm

    code = cmd.code
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
        topic, group = (f("topic"), f("group")) if code == 10 else (f("b"), f("a"))
        if topic is not None and topic.startswith(RETRY_PREFIX):
            add(_retry(group), SUB)
        else:
            add(topic, PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(_retry(f("group")), SUB)
    elif code == RequestCode.PULL_MESSAGE:
        add(f("topic"), SUB)
        add(_retry(f("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(f("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        try:
            data: Any = jsonlenient.loads(cmd.body) if cmd.body else {}
            for consumer in data.get("consumerDataSet") or []:
                add(_retry(consumer.get("groupName")), SUB)
                for sub in consumer.get("subscriptionDataSet") or []:
                    add(sub.get("topic"), SUB)
        except (ValueError, AttributeError, TypeError) as exc:
            # Java wraps any parse failure in an AclException: the request is refused
            raise AclDenied(
                f"heartbeat body does not parse: {type(exc).__name__}", None, _PARSE
            ) from None
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(_retry(f("consumerGroup")), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(_retry(f("consumerGroup")), SUB)
        add(f("topic"), SUB)
    return out


def default_acl_path(config: BrokerConfig) -> Path:
    """Where the file is looked for: ``aclPlainFile`` if set; else, as RocketMQ,
    ``$ROCKETMQ_HOME/conf/plain_acl.yml``; else ``<storePathRootDir>/../conf/plain_acl.yml``."""
    if config.aclPlainFile:
        return Path(config.aclPlainFile)
    home = os.environ.get("ROCKETMQ_HOME")
    if home:
        return Path(home) / "conf" / "plain_acl.yml"
    return Path(config.storePathRootDir).absolute().parent / "conf" / "plain_acl.yml"


def read_acl_data(p: Path, *, allow_empty: bool = False) -> dict[str, Any]:
    """The file as YAML data; errors name the file and the place, never its text."""
    import yaml

    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"aclEnable=true but cannot read {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        # str(exc) quotes the offending lines (secrets included): report only the place.
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "parse error"
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML: {where}{problem}") from None
    if data is None and allow_empty:
        return {}  # an emptied file: RocketMQ's admin requests start it afresh
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with 'accounts'")
    return data


def load_acl(path: str | Path) -> PlainAcl:
    """Read a plain_acl.yml; every error names the file and the account's access key
    (RocketMQ's own message also prints the secret; this one does not)."""
    p = Path(path)
    return parse_acl_data(read_acl_data(p), p)


def parse_acl_data(data: dict[str, Any], p: Path) -> PlainAcl:
    try:
        return _parse_acl(data, p)
    except ConfigError as exc:
        text = str(exc).removeprefix("plain_acl.yml: ")
        raise ConfigError(text if text.startswith(str(p)) else f"{p}: {text}") from None


def check_resource_perms(resources: list[str] | None) -> str | None:
    """Permission.checkResourcePerms: what is wrong with a ``NAME=PERM`` list, if anything."""
    for resource in resources or []:
        items = [i for i in resource.split("=") if i]
        if len(items) != 2:
            return (
                f"Parse Resource format error for {resource}.\n"
                "The expected resource format is 'Res=Perm'. For example: topicA=SUB"
            )
        perm = items[1].strip()
        if perm != "DENY" and parse_perm(perm) == DENY:
            return (
                f"Parse resource permission error for {resource}.\n"
                "The expected permissions are 'SUB' or 'PUB' or 'SUB|PUB' or 'PUB|SUB'."
            )
    return None


def _parse_acl(data: dict[str, Any], p: Path) -> PlainAcl:
    global_white = [
        parse_address_pattern(str(a)) for a in data.get("globalWhiteRemoteAddresses") or []
    ]
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(data.get("accounts") or []):
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: accounts[{i}] is not a mapping")
        ak = "" if raw.get("accessKey") is None else str(raw["accessKey"])
        sk = "" if raw.get("secretKey") is None else str(raw["secretKey"])
        if len(ak) <= _MIN_KEY_LEN or len(sk) <= _MIN_KEY_LEN:
            raise ConfigError(
                f"{p}: accounts[{i}] (accessKey={ak!r}): accessKey and secretKey must be "
                f"longer than {_MIN_KEY_LEN} characters"
            )
        if ak in accounts:
            raise ConfigError(f"{p}: accessKey {ak!r} appears twice")
        account = Account(
            access_key=ak,
            secret_key=sk,
            white=parse_address_pattern(
                None if raw.get("whiteRemoteAddress") is None else str(raw["whiteRemoteAddress"])
            ),
            admin=str(raw.get("admin", False)).lower() == "true",
            default_topic_perm=parse_perm(raw.get("defaultTopicPerm")),
            default_group_perm=parse_perm(raw.get("defaultGroupPerm")),
        )
        for key, is_topic in (("topicPerms", True), ("groupPerms", False)):
            for item in raw.get(key) or []:
                name, sep, perm = str(item).partition("=")
                if not sep or "=" in perm or not name.strip():
                    raise ConfigError(
                        f"{p}: accessKey {ak!r}: {key} entry {item!r} is not NAME=PERM"
                    )
                resource = name.strip() if is_topic else RETRY_PREFIX + name.strip()
                account.perms[resource] = parse_perm(perm)
        accounts[ak] = account
    version = (0, int(time.time() * 1000))
    listed = data.get("dataVersion")
    if isinstance(listed, list) and listed and isinstance(listed[0], dict):
        try:
            version = (int(listed[0].get("counter", 0)), int(listed[0].get("timestamp", 0)))
        except (TypeError, ValueError):
            raise ConfigError(f"{p}: dataVersion is not a counter and a timestamp") from None
    return PlainAcl(accounts=accounts, global_white=global_white, path=str(p), version=version)


ACL_POLL_S = 0.5


class AclFileWatch:
    """Reload plain_acl.yml when it changes, as RocketMQ 4.9.7's PlainPermissionManager
    does (its FileWatchService polls a digest of the file). A digest of the content
    catches an in-place rewrite and a replacement by rename alike, even one within the
    same mtime tick, and needs no extra dependency (the file is small); a
    file that no longer loads is reported in one line (file and place, never a secret)
    and the last good rules stay in force."""

    def __init__(self, acl: PlainAcl, on_reload: Callable[[PlainAcl], None]) -> None:
        self.path = Path(acl.path)
        self.on_reload = on_reload
        self._stamp = self._current()

    def _current(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def poll(self) -> bool:
        """Reload if the file changed since the last poll; True when new rules apply."""
        stamp = self._current()
        if stamp == self._stamp or stamp is None:
            return False
        self._stamp = stamp
        try:
            acl = load_acl(self.path)
        except ConfigError as exc:
            log.error("ACL reload refused, last good rules stay: %s", exc)
            return False
        log.info("ACL reloaded: %d accounts from %s", len(acl.accounts), self.path)
        self.on_reload(acl)
        return True

    async def run(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(ACL_POLL_S)
            self.poll()
