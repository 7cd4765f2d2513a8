"""What the Redis strategies share: connecting from a URL (standalone or Cluster) and
running Lua scripts by SHA, one at a time or pipelined, reloading them where a server
lost them.

Cluster: ``redis+cluster://host:port[,host:port…]`` (``rediss+cluster://`` for TLS) builds
a ``redis.cluster.RedisCluster`` from seed nodes; so does passing one. Every script here
touches only keys that share one hash tag (``{namespace:key}``), so each call runs on the
single node that owns that slot. A batch script (many keys in one call) takes one group
of keys per slot there; the calls are pipelined and grouped per node by redis-py's
cluster pipeline (one round trip per node, MOVED/ASK followed). On a standalone server
a batch is one call.

Single commands on a standalone server go through :class:`Commands`: each thread keeps
one connection of the client's pool and sends and reads on it itself. redis-py's
per-command path (pool checkout and release, observability hooks, the retry wrapper
rebuilt per call) costs more CPU than a loopback round trip, and a message pays it twice
(claim, commit). The client's own retry policy and encoder still apply.

Why not redis-py's ``Script`` objects: inside a pipeline they add a ``SCRIPT EXISTS`` round
trip to every ``execute()``, and on a cluster a NOSCRIPT from one node must not re-run
the calls that already ran on the others. Here only the calls that answered NOSCRIPT are
re-run, after ``SCRIPT LOAD`` (on every primary of a cluster).
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

try:  # a dependency of idemp; redis-py packs through it too, one argument at a time
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - depends on the environment
    _hiredis_pack = None  # type: ignore[assignment]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: URL schemes the Redis strategies accept (the config picks a Redis strategy for them).
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def cluster_from_url(url: str, **options: Any) -> RedisCluster:
    """``redis+cluster://[user:password@]host:port[,host:port…][/0]``: the seed nodes; the
    rest of the topology is discovered from them (``CLUSTER SLOTS``)."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0]
    if path not in ("", "0"):
        raise ValueError("Redis Cluster has only database 0")
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    nodes = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"cluster seed must be host:port, not {part!r}")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    return RedisCluster(
        startup_nodes=nodes,
        username=username,
        password=password,
        ssl=scheme.lower().startswith("rediss"),
        **options,
    )


def connect(target: str | Any, timeout_s: float) -> tuple[Any, bool]:
    """(client, owned): a client built from a URL (owned: closed by the strategy) or the
    client given (not owned)."""
    if not isinstance(target, str):
        return target, False
    options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if target.split(":", 1)[0].lower() in CLUSTER_SCHEMES:
        return cluster_from_url(target, **options), True
    return redis.Redis.from_url(target, **options), True


def describe(client: Any) -> str:
    """``redis://host:port/db`` or ``redis+cluster://host:port`` (no credentials)."""
    if is_cluster(client):
        nodes = client.get_primaries()
        where = ",".join(n.name for n in nodes[:3]) or "?"
        return f"redis+cluster://{where}"
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def slot_groups(client: Any, keys: Sequence[str], chunk: int) -> list[list[int]]:
    """Indices of ``keys`` grouped so that one script call may take each group: at most
    ``chunk`` keys, and on a cluster all of one hash slot (a script's keys must be)."""
    if not is_cluster(client):
        return [list(range(i, min(i + chunk, len(keys)))) for i in range(0, len(keys), chunk)]
    by_slot: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_slot.setdefault(client.keyslot(key), []).append(i)
    return [g[i : i + chunk] for g in by_slot.values() for i in range(0, len(g), chunk)]


_generation = 0  # bumped in a forked child: connections held before the fork are not its


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class _Held:
    """A connection checked out of a pool by one thread, given back when the thread ends
    (its thread-local storage is dropped) or when the strategy closes."""

    __slots__ = ("pool", "conn", "generation", "__weakref__")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn: Any = pool.get_connection()
        self.generation = _generation

    def give_back(self) -> None:
        conn, self.conn = self.conn, None
        # A child's inherited connection shares the parent's socket: dropped, never
        # released (the child's pool resets itself; the parent still uses the socket).
        if conn is not None and self.generation == _generation:
            self.pool.release(conn)

    __del__ = give_back


class Commands:
    """Single commands for the strategies' hot path: ``commands("EVALSHA", …)`` (the
    command name one word; arguments ``str``, ``bytes`` or numbers).

    Standalone server: on a connection this thread holds (see the module docstring;
    at most half of the pool's ``max_connections`` are held, so the pool never runs
    dry for other callers: threads beyond that use the client's own path),
    checked before each command the way redis-py checks one at checkout (readable while
    idle = closed by the server, e.g. a restart, an idle timeout or CLIENT KILL, or a reply
    left unread: reconnect), and run under the connection's retry policy (none for a
    client made by ``from_url``, as in redis-py). Cluster: through the client, which
    routes by slot and follows MOVED/ASK."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        # Left to redis-py's own command path: RESP3 clients, which may get pushes
        # (client-side caching, maintenance notifications) on an idle connection.
        self._direct = (
            isinstance(pool, redis.ConnectionPool)
            and not is_cluster(client)
            and str(pool.connection_kwargs.get("protocol") or 2) == "2"
            and getattr(pool, "cache", None) is None
        )
        self._local = threading.local()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._lock = threading.Lock()

    def _holding(self) -> _Held | None:
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.conn is None or held.generation != _generation:
            pool = self.client.connection_pool
            with self._lock:
                if len(self._held) >= pool.max_connections // 2:
                    return None
                held = _Held(pool)
                self._held.add(held)
            self._local.held = held
        return held

    def __call__(self, *args: Any) -> Any:
        held = self._holding() if self._direct else None
        if held is None:
            return self.client.execute_command(*args)
        conn = held.conn
        try:
            stale = conn.can_read()  # an idle connection has nothing to read
        except (ConnectionError, TimeoutError, OSError):
            stale = True
        if stale:
            conn.disconnect()  # the send below connects again

        def once() -> Any:
            try:
                if _hiredis_pack is not None:  # one C call for the whole command
                    conn.send_packed_command([_hiredis_pack(args)])
                else:
                    conn.send_command(*args)
                return conn.read_response()
            except ResponseError:  # a whole error reply was read: the connection is fine
                raise
            except BaseException:  # e.g. interrupted between send and read: a reply may
                conn.disconnect()  # be left unread; never let the next command read it
                raise

        return conn.retry.call_with_retry(once, lambda _error: conn.disconnect())

    def close(self) -> None:
        """Give every held connection back to the pool (the client's owner closes it)."""
        with self._lock:
            held = list(self._held)
            self._held.clear()
        for h in held:
            h.give_back()


class LuaScript:
    """One Lua script, run by ``EVALSHA``; loaded where missing. Single calls go through
    ``commands``, pipelined ones through its client."""

    __slots__ = ("client", "commands", "text", "sha")

    def __init__(self, commands: Commands, text: str) -> None:
        self.commands = commands
        self.client = commands.client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def load(self) -> None:
        # On a cluster, SCRIPT LOAD goes to every primary (redis-py's routing for it).
        self.client.script_load(self.text)

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.commands("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.load()
            return self.commands("EVALSHA", self.sha, len(keys), *keys, *args)

    def many(self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """EVALSHA once per (keys, args), pipelined (per node on a cluster), in order.

        Calls that answered NOSCRIPT (a node restarted) are re-run after a load, and
        only those: each of them failed before running. Any other error is raised after
        the whole batch was read; the replies of the others are then lost to the caller,
        which treats the batch as failed (the scripts make a re-run by the same owner
        harmless)."""
        replies = self._pipelined(calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self.load()
            again = self._pipelined([calls[i] for i in missing])
            for i, reply in zip(missing, again):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def per_key(
        self,
        keys: Sequence[str],
        shared: Sequence[Any],
        each: Sequence[Sequence[Any]],
        chunk: int = 128,
    ) -> list[Any]:
        """Run a batch script (``KEYS`` = many keys, ``ARGV`` = ``shared`` then each key's
        ``each[i]``, one reply per key) over ``keys``: one EVALSHA per group of at most
        ``chunk`` keys (a script holds the server while it runs) that share a slot; on a
        standalone server every key does. Replies come back in the order of ``keys``."""
        groups = slot_groups(self.client, keys, chunk)
        calls = []
        for group in groups:
            args = list(shared)
            for i in group:
                args.extend(each[i])
            calls.append(([keys[i] for i in group], args))
        if len(calls) == 1:
            return list(self(*calls[0]))
        out: list[Any] = [None] * len(keys)
        for group, replies in zip(groups, self.many(calls)):
            for i, reply in zip(group, replies):
                out[i] = reply
        return out

    def _pipelined(self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        command = pipe.execute_command
        sha = self.sha
        for keys, args in calls:
            command("EVALSHA", sha, len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))
