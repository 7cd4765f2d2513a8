"""URL helpers shared by the settings and the strategies (a leaf module: imports nothing of idemp).

Kept apart so that :mod:`idemp.config`, which builds strategies, and the strategies, which
describe their stores, both import downwards instead of each other.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/]*)(?::[^@/]*)?@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd|secret|token|sslpassword)=)[^&]*")


def mask_url(url: str) -> str:
    """``redis://:s3cret@host/0`` → ``redis://:***@host/0``; secret query values too."""

    def hide(m: re.Match[str]) -> str:
        has_password = ":" in m.group(0)[len(m["scheme"]) :]
        return f"{m['scheme']}{m['user']}:***@" if has_password else m.group(0)

    masked = _USERINFO.sub(hide, url)
    return _SECRET_QUERY.sub(r"\1***", masked)
