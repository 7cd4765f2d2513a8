"""How the Redis strategies use their client's connections on a standalone server: one
held per thread (given back when the thread ends or the strategy closes), a new one in a
forked child, a killed one replaced under the client's retry policy, and replies read
alike whether or not the client decodes responses."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

import pytest
import redis

from idemp import Message, Outcome, idempotent
from idemp.strategies import Job, RedisFlag, RedissonLock


def _msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=uuid.uuid4().hex)


def _in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)


def test_one_connection_per_thread_given_back_at_thread_end_and_close(redis_server: Any):
    client = redis.Redis.from_url(redis_server.url)
    strategy = RedisFlag(client, prefix=f"t{uuid.uuid4().hex[:8]}")

    @idempotent(key="keys", strategy=strategy, namespace="g/Orders")
    def handle(message: Message) -> None:
        return None

    held = threading.Barrier(5)
    leave = threading.Event()
    outcomes: list[Outcome] = []

    def worker(n: int) -> None:
        for i in range(50):
            outcomes.append(handle(_msg(f"w{n}-{i}")).outcome)
        held.wait(10)
        leave.wait(10)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    held.wait(10)  # every worker has run its 50 messages and still lives
    assert _in_use(client) == 4
    leave.set()
    for t in threads:
        t.join(10)
    assert _in_use(client) == 0  # each thread's connection went back as it ended

    assert handle(_msg("main")).outcome is Outcome.PROCESSED
    assert _in_use(client) == 1
    strategy.close()
    assert _in_use(client) == 0
    assert outcomes == [Outcome.PROCESSED] * 200
    client.close()


def test_killed_connection_is_replaced_and_the_message_processed_once(redis_server: Any):
    client = redis.Redis.from_url(redis_server.url)
    strategy = RedisFlag(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    runs: list[str] = []

    @idempotent(key="keys", strategy=strategy, namespace="g/Orders")
    def handle(message: Message) -> None:
        runs.append(message.keys[0])

    assert handle(_msg("a")).outcome is Outcome.PROCESSED
    killer = redis.Redis.from_url(redis_server.url)
    assert killer.client_kill_filter(_type="normal", skipme=True) >= 1  # ours among them
    assert handle(_msg("b")).outcome is Outcome.PROCESSED  # the claim is re-sent once
    assert handle(_msg("b")).outcome is Outcome.DUPLICATE
    assert handle(_msg("a")).outcome is Outcome.DUPLICATE
    assert runs == ["a", "b"]
    strategy.close()
    killer.close()
    client.close()


def _held_port(commands: Any) -> int:
    """The local port of the connection this thread holds (one is held after a claim)."""
    held = commands._holding()
    assert held is not None and held.conn is not None
    return int(held.conn._sock.getsockname()[1])


def test_forked_child_uses_its_own_connection(redis_server: Any):
    client = redis.Redis.from_url(redis_server.url)
    strategy = RedisFlag(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    commands = strategy._commands
    assert strategy.begin(Job("g/Orders", "parent-1", _msg("parent-1"))).token
    parent_port = _held_port(commands)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: claim and commit a key, report its connection's port
        code = 1
        try:
            ticket = strategy.begin(Job("g/Orders", "child-1", _msg("child-1")))
            strategy.commit(ticket)
            port = _held_port(commands)
            os.write(write, str(port).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    child_port = int(os.read(read, 32) or b"0")
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_port not in (0, parent_port)

    # The parent's held connection is intact and still its own.
    ticket = strategy.begin(Job("g/Orders", "parent-2", _msg("parent-2")))
    strategy.commit(ticket)
    assert _held_port(commands) == parent_port
    record = strategy.get("g/Orders", "child-1")
    assert record is not None and record.status == "CONSUMED"
    strategy.close()
    client.close()


def test_client_decoding_responses_reads_the_same(redis_server: Any):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    flag = RedisFlag(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    lock = RedissonLock(client, prefix=f"t{uuid.uuid4().hex[:8]}", renew_s=None)
    runs: list[str] = []

    @idempotent(key="keys", strategy=flag, namespace="g/Orders", fingerprint=True)
    def handle(message: Message) -> None:
        runs.append(message.keys[0])

    @idempotent.batch(key="keys", strategy=flag, namespace="g/Orders")
    def handle_batch(messages: list[Message]) -> None:
        runs.extend(m.keys[0] for m in messages)

    @idempotent(key="keys", strategy=lock, namespace="g/Orders")
    def locked(message: Message) -> None:
        runs.append("locked")

    assert handle(_msg("a")).outcome is Outcome.PROCESSED
    assert handle(_msg("a")).outcome is Outcome.DUPLICATE
    other = Message("Orders", b"another body", keys=("a",), msg_id="m2")
    assert handle(other).outcome is Outcome.PAYLOAD_CONFLICT
    batch = handle_batch([_msg("b"), _msg("a")])
    assert [r.outcome for r in batch.results] == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert locked(_msg("c")).outcome is Outcome.PROCESSED
    assert runs == ["a", "b", "locked"]
    lock.close()
    flag.close()
    client.close()


@pytest.mark.parametrize("kind, threads", [("plain", 4), ("blocking", 6)])
def test_a_bounded_pool_is_never_drained_by_held_connections(
    redis_server: Any, kind: str, threads: int
):
    """Threads hold at most half of ``max_connections``; the others check one out per
    command, as redis-py does, so a pool of four serves four threads plus the main
    thread's reads (a plain pool raises at its limit), or six threads that wait their
    turn (a blocking pool): both would fail if every thread kept one."""
    if kind == "plain":
        pool: redis.ConnectionPool = redis.ConnectionPool.from_url(
            redis_server.url, max_connections=4
        )
    else:
        pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=4, timeout=5)
    client = redis.Redis(connection_pool=pool)
    strategy = RedisFlag(client, prefix=f"t{uuid.uuid4().hex[:8]}")

    @idempotent(key="keys", strategy=strategy, namespace="g/Orders")
    def handle(message: Message) -> None:
        return None

    halfway = threading.Barrier(threads + 1)
    go_on = threading.Event()
    outcomes: list[Outcome] = []

    def worker(n: int) -> None:
        for i in range(100):
            if i == 50:
                halfway.wait(30)
                go_on.wait(30)
            outcomes.append(handle(_msg(f"w{n}-{i}")).outcome)
            outcomes.append(handle(_msg(f"w{n}-{i}")).outcome)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    halfway.wait(30)  # every worker has run 50 messages and still lives
    assert len(strategy._commands._held) == 2
    record = strategy.get("g/Orders", "w0-0")  # the main thread still gets a connection
    assert record is not None and record.status == "CONSUMED"
    go_on.set()
    for t in workers:
        t.join(60)
    assert outcomes.count(Outcome.PROCESSED) == 100 * threads
    assert outcomes.count(Outcome.DUPLICATE) == 100 * threads
    assert len(strategy._commands._held) == 0  # given back as each thread ended
    strategy.close()
    client.close()
