"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2) in a child process.

It cannot share a virtualenv with the 4.x wheel (both install a top-level ``rocketmq``),
so it runs in ``.cache/v5-venv`` (made by ``make test``), driven by the test process over
JSON lines: each stdin line is a command ``{"id": n, "op": ..., ...}``; each answer is one
stdout line ``@@v5 {"id": n, "ok": true, ...}`` (or ``"ok": false`` with the exception's
class, code and message). Clients live under names; a received message is kept under a
reference (``ref``) so the test can ack it or change its invisible duration later.

Ops: producer, send, send_tx (half message, then commit/rollback/none), simple, receive,
ack, change, push (a PushConsumer whose listener fails the bodies it is told to and
records every call), wait_push, shutdown, exit.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType

MARK = "@@v5 "
clients: dict[str, Any] = {}
kept: dict[int, Any] = {}
pushed: dict[str, list[dict[str, Any]]] = {}
pushed_cond = threading.Condition()
checks: list[dict[str, Any]] = []
next_ref = [0]
out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    with out_lock:
        sys.stdout.write(MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()


def describe(m: Any, keep: bool) -> dict[str, Any]:
    d = {
        "message_id": m.message_id,
        "topic": m.topic,
        "body": m.body.decode("utf-8", "replace"),
        "tag": m.tag,
        "keys": sorted(m.keys or []),
        "properties": dict(m.properties or {}),
        "message_group": m.message_group,
        "delivery_attempt": m.delivery_attempt,
        "delivery_timestamp": m.delivery_timestamp,
        "at": time.monotonic(),
        "wall": time.time(),
    }
    if keep:
        next_ref[0] += 1
        kept[next_ref[0]] = m
        d["ref"] = next_ref[0]
    return d


def build(spec: dict[str, Any]) -> Message:
    m = Message()
    m.topic = spec["topic"]
    m.body = spec.get("body", "").encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    for key in spec.get("keys") or ():
        m.keys = key  # the setter adds one key per assignment
    for k, v in (spec.get("properties") or {}).items():
        m.add_property(k, v)
    if spec.get("message_group"):
        m.message_group = spec["message_group"]
    if spec.get("delivery_timestamp"):
        m.delivery_timestamp = spec["delivery_timestamp"]
    return m


class Checker(TransactionChecker):
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def check(self, message: Message) -> TransactionResolution:
        checks.append({"message_id": message.message_id, "at": time.monotonic()})
        return getattr(TransactionResolution, self.answer)


class Listener(MessageListener):
    def __init__(self, name: str, fail: set[str]) -> None:
        self.name = name
        self.fail = fail

    def consume(self, message: Message) -> ConsumeResult:
        d = describe(message, keep=False)
        failed = d["body"] in self.fail
        d["result"] = "FAILURE" if failed else "SUCCESS"
        with pushed_cond:
            pushed.setdefault(self.name, []).append(d)
            pushed_cond.notify_all()
        return ConsumeResult.FAILURE if failed else ConsumeResult.SUCCESS


def config(cmd: dict[str, Any]) -> ClientConfiguration:
    return ClientConfiguration(
        cmd["endpoint"], Credentials(), request_timeout=cmd.get("timeout", 10)
    )


def run(cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "producer":
        checker = Checker(cmd["check"]) if cmd.get("check") else None
        p = Producer(config(cmd), tuple(cmd["topics"]), checker, tls_enable=cmd.get("tls", False))
        p.startup()
        clients[cmd["name"]] = p
        return {}
    if op == "send":
        p = clients[cmd["name"]]
        receipts = []
        for spec in cmd["messages"]:
            r = p.send(build(spec))
            receipts.append(
                {
                    "message_id": r.message_id,
                    "recall_handle": r.recall_handle,
                    "at": time.monotonic(),
                }
            )
        return {"receipts": receipts}
    if op == "recall":
        return {"message_id": clients[cmd["name"]].recall_message(cmd["topic"], cmd["handle"])}
    if op == "send_tx":
        p = clients[cmd["name"]]
        tx = p.begin_transaction()
        r = p.send(build(cmd["message"]), tx)
        if cmd["end"] == "commit":
            tx.commit()
        elif cmd["end"] == "rollback":
            tx.rollback()
        return {"message_id": r.message_id}
    if op == "checks":
        return {"checks": list(checks)}
    if op == "simple":
        kind = FilterType.SQL if cmd.get("sql") else FilterType.TAG
        subs = {t: FilterExpression(e, kind) for t, e in cmd["subs"].items()}
        c = SimpleConsumer(
            config(cmd), cmd["group"], subs, cmd.get("await", 5), tls_enable=cmd.get("tls", False)
        )
        c.startup()
        # RocketMQ fails a receive before the settings arrived (50001); the client's
        # startup waits for them only for a PushConsumer, so wait here as idemp's loop does
        if not c._init_settings_event.wait(10):
            raise RuntimeError("no settings from the server within 10 s")
        clients[cmd["name"]] = c
        return {}
    if op == "receive":
        c = clients[cmd["name"]]
        began = time.monotonic()
        got = c.receive(cmd.get("max", 16), cmd["invisible"])
        messages = [describe(m, keep=True) for m in got]
        for m in messages:  # asked before the server popped it, so before it turned invisible
            m["asked"] = began
        return {"messages": messages, "waited": time.monotonic() - began}
    if op == "ack":
        clients[cmd["name"]].ack(kept[cmd["ref"]])
        return {}
    if op == "change":
        c = clients[cmd["name"]]
        c.change_invisible_duration(kept[cmd["ref"]], cmd["invisible"])
        return {}
    if op == "push":
        subs = {t: FilterExpression(e) for t, e in cmd["subs"].items()}
        listener = Listener(cmd["name"], set(cmd.get("fail", [])))
        c = PushConsumer(
            config(cmd),
            cmd["group"],
            listener,
            subs,
            consumption_thread_count=cmd.get("threads", 4),
        )
        c.startup()
        clients[cmd["name"]] = c
        return {}
    if op == "wait_push":
        deadline = time.monotonic() + cmd["within"]
        with pushed_cond:
            while len(pushed.get(cmd["name"], [])) < cmd["count"]:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                pushed_cond.wait(left)
            return {"calls": list(pushed.get(cmd["name"], []))}
    if op == "shutdown":
        clients.pop(cmd["name"]).shutdown()
        return {}
    raise ValueError(f"unknown op {op!r}")


def _code(exc: Exception) -> Any:
    code = getattr(exc, "code", None)
    if callable(code):  # a grpc.RpcError: its status code, by name
        return str(code())
    return code


def main() -> None:
    emit({"id": 0, "ok": True, "ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            answer = run(cmd)
            answer.update(id=cmd["id"], ok=True)
        except Exception as exc:  # reported to the test, which asserts on it
            answer = {
                "id": cmd["id"],
                "ok": False,
                "error": type(exc).__name__,
                "code": _code(exc),
                "message": str(exc),
                "trace": traceback.format_exc(limit=3),
            }
        emit(answer)
    for c in list(clients.values()):
        try:
            c.shutdown()
        except Exception:  # noqa: S112 - shutting down after the test's last command
            continue


if __name__ == "__main__":
    main()
