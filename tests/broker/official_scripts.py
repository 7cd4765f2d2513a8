"""The official RocketMQ client (rocketmq-client-python 0.5.0rc2, C++ inside) in child processes.

Why child processes: the C++ client keeps one client id, one connection per server and
one client factory per *process*, so two consumers of one group in one process are a
single client to the broker, and state (routes, connections, threads) would leak from one
test's broker into the next. Each scenario therefore runs its clients as separate
processes of this file:

    python official_scripts.py consume --namesrv A --group G --topic T [--expression E]
                                       [--orderly] [--broadcasting] [--props p1,p2]
    python official_scripts.py produce --namesrv A --group G

Both speak JSON lines. A child writes events to stdout, each line prefixed with
``MARK`` so anything else the native library prints is ignored:
``{"event": "started"}``, ``{"event": "msg", ...}`` (consumer), ``{"event": "sent", ...}``
(producer), ``{"event": "error", ...}``, ``{"event": "stopped"}``. The producer reads
commands from stdin (``{"op": "send", "messages": [...]}``); both stop on ``stop``.

The test side (``ClientProcess``, ``Clients``) collects events on a reader thread and
lets a test wait for a condition with a deadline; it never sleeps to synchronise.

Times are ``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so a consumer's
receive time and a producer's send time are comparable across processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

MARK = "@@idemp "
SCRIPT = Path(__file__).resolve()

# The first send of a fresh C++ producer can fail at once with "No route info of this
# topic" while it is still connecting to the nameserver (ENVIRONMENT.md); only that
# error is retried, a bounded number of times.
NO_ROUTE = "No route info"
NO_ROUTE_ATTEMPTS = 10
NO_ROUTE_PAUSE_S = 0.2

# One condition for the events of every client process, so a test can wait on a
# predicate over several processes (e.g. "the two consumers together got all").
_EVENTS = threading.Condition()


# --------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------
class _Out:
    """Event lines to stdout; callbacks run on the client's threads, hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        line = MARK + json.dumps({"event": event, **fields}) + "\n"
        with self.lock:
            sys.stdout.write(line)
            sys.stdout.flush()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _consume(args: argparse.Namespace) -> int:
    from rocketmq.client import ConsumeStatus, MessageModel, PushConsumer

    out = _Out()
    props = [p for p in (args.props or "").split(",") if p]
    model = MessageModel.BROADCASTING if args.broadcasting else MessageModel.CLUSTERING

    def on_message(msg: Any) -> Any:
        # A callback that raises is ACKED by the wrapper (ctypes returns 0 =
        # CONSUME_SUCCESS), so everything is caught here and reported instead.
        try:
            out.emit(
                "msg",
                t=time.monotonic(),
                topic=msg.topic,
                id=msg.id,
                body=_text(msg.body),
                keys=_text(msg.keys),
                tags=_text(msg.tags),
                props={p: _text(msg.get_property(p)) for p in props},
                queue_id=msg.queue_id,
                queue_offset=msg.queue_offset,
                reconsume_times=msg.reconsume_times,
            )
            return ConsumeStatus.CONSUME_SUCCESS
        except BaseException as exc:  # noqa: BLE001 - see above
            try:
                out.emit("error", where="callback", error=repr(exc))
            except BaseException:  # noqa: BLE001
                pass
            return ConsumeStatus.RECONSUME_LATER

    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key is not None:
        consumer.set_session_credentials(args.access_key, args.secret_key, args.channel)
    if args.threads:
        consumer.set_thread_count(args.threads)
    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    out.emit("started", pid=os.getpid())
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    consumer.shutdown()
    out.emit("stopped")
    return 0


def _send_one(producer: Any, spec: dict[str, Any]) -> tuple[Any, int]:
    from rocketmq.client import Message

    msg = Message(spec["topic"])
    if spec.get("keys") is not None:
        msg.set_keys(spec["keys"])
    if spec.get("tags") is not None:
        msg.set_tags(spec["tags"])
    for key, value in (spec.get("props") or {}).items():
        msg.set_property(key, value)
    msg.set_body(spec.get("body", ""))
    attempt = 1
    while True:
        try:
            if spec.get("sharding_key") is not None:
                return producer.send_orderly_with_sharding_key(msg, spec["sharding_key"]), attempt
            return producer.send_sync(msg), attempt
        except Exception as exc:
            if NO_ROUTE not in str(exc) or attempt >= NO_ROUTE_ATTEMPTS:
                raise
            attempt += 1
            time.sleep(NO_ROUTE_PAUSE_S)  # the producer is still fetching its first route


def _produce(args: argparse.Namespace) -> int:
    from rocketmq.client import Producer

    out = _Out()
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key is not None:
        producer.set_session_credentials(args.access_key, args.secret_key, args.channel)
    producer.start()
    out.emit("started", pid=os.getpid())
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        command = json.loads(line)
        for spec in command["messages"]:
            t0 = time.monotonic()
            try:
                result, attempts = _send_one(producer, spec)
            except Exception as exc:
                out.emit("error", where="send", error=str(exc), ref=spec.get("ref"))
                continue
            out.emit(
                "sent",
                ref=spec.get("ref"),
                status=int(result.status),
                msg_id=result.msg_id,
                offset=result.offset,
                attempts=attempts,
                t0=t0,
                t1=time.monotonic(),
            )
    producer.shutdown()
    out.emit("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("consume")
    c.add_argument("--namesrv", required=True)
    c.add_argument("--group", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--expression", default="*")
    c.add_argument("--orderly", action="store_true")
    c.add_argument("--broadcasting", action="store_true")
    c.add_argument("--props", default="")
    c.add_argument("--threads", type=int, default=0)
    c.set_defaults(func=_consume)
    pr = sub.add_parser("produce")
    pr.add_argument("--namesrv", required=True)
    pr.add_argument("--group", required=True)
    pr.set_defaults(func=_produce)
    for sp in (c, pr):  # set_session_credentials (ACL); without them the client signs with ""
        sp.add_argument("--access-key")
        sp.add_argument("--secret-key", default="")
        sp.add_argument("--channel", default="ALIYUN")
    args = p.parse_args(argv)
    return int(args.func(args))


# --------------------------------------------------------------------------------------
# test side
# --------------------------------------------------------------------------------------
class ClientError(AssertionError):
    pass


class ClientProcess:
    """One child process; its events are collected as they arrive."""

    def __init__(self, name: str, argv: list[str], home: Path) -> None:
        self.name = name
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.stderr_path = home / f"{name}.stderr"
        env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1")
        with open(self.stderr_path, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.events: list[dict[str, Any]] = []
        self.cond = _EVENTS
        self.eof = False
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith(MARK):
                continue
            event = json.loads(line[len(MARK) :])
            with self.cond:
                self.events.append(event)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    # --- queries -----------------------------------------------------------------------
    def of(self, kind: str) -> list[dict[str, Any]]:
        with self.cond:
            return [e for e in self.events if e["event"] == kind]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.of("msg")

    def errors(self) -> list[dict[str, Any]]:
        return self.of("error")

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Block until ``predicate()`` holds (re-checked on every event), or fail."""
        wait_until(predicate, timeout, what, self)

    def describe(self) -> str:
        return (
            f"{self.name}: exit={self.proc.poll()}, {len(self.messages)} msgs, "
            f"errors={self.errors()[:3]}\n{self.stderr_tail()}"
        )

    def wait_started(self, timeout: float = 30.0) -> None:
        # start() fetches routes and registers with the broker: well under a second
        # on an idle machine, a few seconds on a loaded one.
        self.wait(lambda: bool(self.of("started")), timeout, "start")

    def stderr_tail(self) -> str:
        try:
            return "".join(self.stderr_path.read_text().splitlines(True)[-20:])
        except OSError:
            return ""

    # --- control -----------------------------------------------------------------------
    def write(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def request_stop(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.write("stop")
            except (BrokenPipeError, ValueError):
                pass

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the client down cleanly (shutdown() persists offsets, unregisters)."""
        self.request_stop()
        self.join(timeout)

    def join(self, timeout: float = 20.0) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ClientError(
                f"{self.name}: did not stop within {timeout:.0f} s\n{self.stderr_tail()}"
            ) from None
        self._reader.join(5)
        self._close_pipes()
        if code != 0 or not self.of("stopped"):
            raise ClientError(
                f"{self.name}: exit {code} without a clean stop\n{self.stderr_tail()}"
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # stdin of a dead child: the buffered "stop" cannot go
                    pass


def poll(predicate: Callable[[], bool], timeout: float, *procs: ClientProcess) -> bool:
    """Wait until ``predicate()`` holds, re-checking it on every event of any client;
    False once ``timeout`` passed or one of ``procs`` has exited."""
    deadline = time.monotonic() + timeout
    with _EVENTS:
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0 or any(p.eof for p in procs):
                return predicate()
            _EVENTS.wait(left)
    return True


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, *procs: ClientProcess
) -> None:
    """``poll`` that fails the test when the deadline passes."""
    if not poll(predicate, timeout, *procs):
        details = "\n".join(p.describe() for p in procs)
        raise ClientError(f"{what}: not reached within {timeout:.0f} s\n{details}")


class Producer(ClientProcess):
    def send(
        self, messages: Iterable[dict[str, Any]], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Send (synchronously, in order) and return one ``sent`` event per message."""
        batch = list(messages)
        before = len(self.of("sent")) + len(self.of("error"))
        self.write(json.dumps({"op": "send", "messages": batch}))
        self.wait(
            lambda: len(self.of("sent")) + len(self.of("error")) >= before + len(batch),
            timeout,
            f"{len(batch)} send results",
        )
        with self.cond:
            results = [e for e in self.events if e["event"] in ("sent", "error")][before:]
        failed = [e for e in results if e["event"] == "error"]
        if failed:
            raise ClientError(f"{self.name}: {len(failed)} sends failed: {failed[:3]}")
        not_ok = [e for e in results if e["status"] != 0]
        if not_ok:
            raise ClientError(f"{self.name}: sends not SEND_OK: {not_ok[:3]}")
        return results


class Clients:
    """Starts client processes for one test and makes sure all of them end with it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.started: list[ClientProcess] = []

    def consumer(
        self,
        namesrv: str,
        group: str,
        topic: str,
        *,
        expression: str = "*",
        orderly: bool = False,
        broadcasting: bool = False,
        props: Iterable[str] = (),
        name: str | None = None,
        wait: bool = True,
        credentials: tuple[str, str] | None = None,
    ) -> ClientProcess:
        argv = ["consume", "--namesrv", namesrv, "--group", group, "--topic", topic]
        argv += ["--expression", expression, "--props", ",".join(props)]
        argv += _credential_args(credentials)
        if orderly:
            argv.append("--orderly")
        if broadcasting:
            argv.append("--broadcasting")
        proc = ClientProcess(f"{name or 'consumer'}{len(self.started)}", argv, self.home)
        self.started.append(proc)
        if wait:
            proc.wait_started()
        return proc

    def producer(
        self,
        namesrv: str,
        group: str = "idemp-test-producer",
        credentials: tuple[str, str] | None = None,
    ) -> Producer:
        argv = ["produce", "--namesrv", namesrv, "--group", group]
        argv += _credential_args(credentials)
        proc = Producer(f"producer{len(self.started)}", argv, self.home)
        self.started.append(proc)
        proc.wait_started()
        return proc

    def stop_all(self, procs: Iterable[ClientProcess], timeout: float = 20.0) -> None:
        """Ask all to stop at once, then wait for each."""
        procs = list(procs)
        for p in procs:
            p.request_stop()
        for p in procs:
            p.join(timeout)

    def close(self) -> None:
        for p in self.started:
            if p.proc.poll() is None:
                p.request_stop()
        for p in self.started:
            try:
                p.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
            p.kill()  # no-op for a child that has exited; closes its pipes


def _credential_args(credentials: tuple[str, str] | None) -> list[str]:
    """(accessKey, secretKey) for set_session_credentials; None leaves the client's default."""
    if credentials is None:
        return []
    return ["--access-key", credentials[0], "--secret-key", credentials[1]]


def clients_fixture(tmp_path: Path) -> Iterator[Clients]:
    """Body of the ``clients`` fixture of the test_official_* modules."""
    clients = Clients(tmp_path / "client-home")
    try:
        yield clients
    finally:
        clients.close()


if __name__ == "__main__":
    sys.exit(main())
