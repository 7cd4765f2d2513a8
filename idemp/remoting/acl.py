"""RocketMQ 4.x ACL request signing: what ``AclClientRPCHook`` adds to a request and what
``PlainAccessValidator`` checks it against.

Sans-IO and in the codec layer because both sides need the same bytes: idemp's client
signs its requests, idemp's broker verifies a client's. The signature is a base64
HmacSHA1, keyed by the account's secret, over the request's header fields' values sorted
by name (``AccessKey`` and ``SecurityToken`` among them) and then the body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from .command import RemotingCommand, _ext_value

ACCESS_KEY = "AccessKey"
SECURITY_TOKEN = "SecurityToken"
SIGNATURE = "Signature"
# QUERY_MESSAGE's "by unique key" flag is added after the header, so the Java client's
# hook never signs it and the broker's validator leaves it out
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_UNSIGNED = (SIGNATURE, UNIQUE_KEY_QUERY)


def signature(cmd: RemotingCommand, secret_key: str) -> str:
    """The ``Signature`` of ``cmd`` as its fields stand (the wire form of each value)."""
    content = "".join(
        _ext_value(v) for k, v in sorted(cmd.ext_fields.items()) if k not in _UNSIGNED
    ).encode("utf-8") + bytes(cmd.body or b"")
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(
    cmd: RemotingCommand, access_key: str, secret_key: str, security_token: str | None = None
) -> None:
    """Add ``AccessKey`` (and ``SecurityToken``) and the ``Signature`` over them and the
    rest, as ``AclClientRPCHook.doBeforeRequest`` does. Signing again gives the same."""
    cmd.ext_fields[ACCESS_KEY] = access_key
    if security_token:
        cmd.ext_fields[SECURITY_TOKEN] = security_token
    cmd.ext_fields[SIGNATURE] = signature(cmd, secret_key)


def is_acl_refusal(remark: str | None) -> bool:
    """A broker's answer to a request its ACL refused (RocketMQ's and idemp's alike name
    the exception in the remark)."""
    return remark is not None and "AclException" in remark
