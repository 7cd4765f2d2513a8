"""ACL administration over the wire (request codes 50-54), as RocketMQ 4.9.7's broker
serves ``mqadmin updateAclConfig``, ``deleteAccessConfig``, ``updateGlobalWhiteAddr``,
``clusterAclConfigVersion`` and ``getAccessConfigSubCommand``.

The changes are written to the broker's ``plain_acl.yml`` the way PlainPermissionManager
writes them (an updated account moves to the end of ``accounts``, a ``dataVersion``
entry counts the changes) and apply at once. Differences, on purpose: RocketMQ 4.9.7
lets any signed account change the ACL and read every secret; idemp asks for an admin
account (or a globally white-listed address) for all but the version query, and never
echoes a secret in an error. With ``aclEnable=false`` RocketMQ fails on a missing
validator (a NullPointerException's text, or no answer at all for 52 and 54); idemp
answers the same failure codes with words that say why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.jsonlenient import dumps

from .acl import PlainAcl, check_resource_perms, parse_acl_data, read_acl_data
from .config import ConfigError

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

# ResponseCode of RocketMQ 4.9.7
UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
DELETE_ACL_CONFIG_FAILED = 210
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
NOT_ENABLED = "ACL is not enabled on this broker (aclEnable=false)"
_MIN_KEY_LEN = 6


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.UPDATE_AND_CREATE_ACL_CONFIG] = update_account
    handlers[RequestCode.DELETE_ACL_CONFIG] = delete_account
    handlers[RequestCode.GET_BROKER_CLUSTER_ACL_INFO] = versions
    handlers[RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG] = update_global_white
    handlers[RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG] = accounts


def _split(text: str | None) -> list[str] | None:
    """UtilAll.split: Java's String.split (trailing empty items dropped)."""
    if text is None:
        return None
    items = text.split(",")
    while items and items[-1] == "":
        items.pop()
    return items


def _write(server: Broker, acl: PlainAcl, data: dict[str, Any]) -> None:
    """Count the change in ``dataVersion``, check the result loads, write it, apply it."""
    counter, _ = acl.version
    data["dataVersion"] = [{"counter": counter + 1, "timestamp": int(time.time() * 1000)}]
    path = Path(acl.path)
    checked = parse_acl_data(data, path)  # a ConfigError leaves the file as it was
    import yaml

    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    server.acl = checked  # what was just written, parsed once


def _change(
    server: Broker, cmd: RemotingCommand, failed: int, edit: Callable[[dict[str, Any]], str | None]
) -> RemotingCommand:
    """Read the file, let ``edit`` change its data (or say why not), write it, apply it."""
    acl = server.acl
    if acl is None:
        return cmd.response(failed, NOT_ENABLED)
    try:
        data = read_acl_data(Path(acl.path), allow_empty=True)
        refusal = edit(data)
        if refusal is not None:
            return cmd.response(failed, refusal)
        _write(server, acl, data)
    except (ConfigError, OSError) as exc:
        return cmd.response(failed, str(exc))
    return cmd.response(ResponseCode.SUCCESS)


def update_account(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """PlainPermissionManager.updateAccessConfig + createAclAccessConfigMap."""
    f = cmd.ext_fields

    def edit(data: dict[str, Any]) -> str | None:
        ak, sk = f.get("accessKey"), f.get("secretKey")
        if ak is None or sk is None or len(ak) <= _MIN_KEY_LEN or len(sk) <= _MIN_KEY_LEN:
            shown = "null" if sk is None else "*" * len(sk)  # RocketMQ prints the secret
            return (
                f"The accessKey={ak} and secretKey={shown} cannot be null and length should "
                "longer than 6"
            )
        topic_perms, group_perms = _split(f.get("topicPerms")), _split(f.get("groupPerms"))
        error = check_resource_perms(topic_perms) or check_resource_perms(group_perms)
        if error:
            return error
        listed = data.get("accounts")
        accounts_: list[Any] = listed if isinstance(listed, list) else []
        account: dict[str, Any] = {}
        for i, existing in enumerate(accounts_):
            if isinstance(existing, dict) and str(existing.get("accessKey")) == ak:
                account = accounts_.pop(i)  # updated in place, then moved to the end
                break
        account["accessKey"] = ak
        account["secretKey"] = sk
        if f.get("whiteRemoteAddress") is not None:
            account["whiteRemoteAddress"] = f["whiteRemoteAddress"]
        account["admin"] = f.get("admin", "false").lower() == "true"
        for key in ("defaultTopicPerm", "defaultGroupPerm"):
            if f.get(key):
                account[key] = f[key]
        if topic_perms is not None:
            account["topicPerms"] = topic_perms
        if group_perms is not None:
            account["groupPerms"] = group_perms
        accounts_.append(account)
        data["accounts"] = accounts_
        return None

    return _change(server, cmd, UPDATE_AND_CREATE_ACL_CONFIG_FAILED, edit)


def delete_account(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """PlainPermissionManager.deleteAccessConfig: an unknown key fails."""
    ak = cmd.ext_fields.get("accessKey")

    def edit(data: dict[str, Any]) -> str | None:
        listed = data.get("accounts")
        rest = [a for a in listed or [] if not (isinstance(a, dict) and a.get("accessKey") == ak)]
        if not ak or not isinstance(listed, list) or len(rest) == len(listed):
            return f"The accesskey[{ak}] corresponding to accessConfig has been deleted failed."
        data["accounts"] = rest
        return None

    return _change(server, cmd, DELETE_ACL_CONFIG_FAILED, edit)


def update_global_white(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """PlainPermissionManager.updateGlobalWhiteAddrsConfig: the list replaces the file's;
    a file named in ``aclFileFullPath`` must be the broker's own."""
    addrs = cmd.ext_fields.get("globalWhiteAddrs")
    named = cmd.ext_fields.get("aclFileFullPath")

    def edit(data: dict[str, Any]) -> str | None:
        if addrs is None:
            return "the custom field <globalWhiteAddrs> is null"
        acl = server.acl
        if named and acl is not None and Path(named).absolute() != Path(acl.path).absolute():
            return f"The globalWhiteAddresses[{addrs}] has been updated failed."
        data["globalWhiteRemoteAddresses"] = _split(addrs)
        return None

    return _change(server, cmd, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, edit)


def _version(acl: PlainAcl) -> dict[str, int]:
    counter, timestamp = acl.version
    return {"counter": counter, "timestamp": timestamp}


def versions(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CLUSTER_ACL_INFO: the file's data version, in the response header."""
    acl = server.acl
    if acl is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, NOT_ENABLED)
    fields = {
        "version": dumps(_version(acl)),
        "allAclFileVersion": dumps({acl.path: _version(acl)}),
        "brokerAddr": server.broker_addr,
        "brokerName": server.config.brokerName,
        "clusterName": server.config.brokerClusterName,
    }
    return cmd.response(ResponseCode.SUCCESS, ext_fields=fields)


def accounts(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CLUSTER_ACL_CONFIG: PlainPermissionManager.getAllAclConfig, read from
    the file (GetBrokerClusterAclConfigResponseBody)."""
    acl = server.acl
    if acl is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, NOT_ENABLED)
    try:
        data = read_acl_data(Path(acl.path), allow_empty=True)
    except ConfigError as exc:
        return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    configs = []
    for raw in data.get("accounts") or []:
        if not isinstance(raw, dict):
            continue
        config: dict[str, Any] = {"admin": str(raw.get("admin", False)).lower() == "true"}
        for key in (
            "accessKey",
            "secretKey",
            "whiteRemoteAddress",
            "defaultTopicPerm",
            "defaultGroupPerm",
        ):
            if raw.get(key) is not None:
                config[key] = str(raw[key])
        for key in ("topicPerms", "groupPerms"):
            if raw.get(key) is not None:
                config[key] = [str(p) for p in raw[key]]
        configs.append(config)
    white = [str(a) for a in data.get("globalWhiteRemoteAddresses") or []]
    body = {"globalWhiteAddrs": white, "plainAccessConfigs": configs}
    return cmd.response(ResponseCode.SUCCESS, body=dumps(body).encode())
