"""Fuzz target for the broker's RocketMQ 5 endpoint: a request to the MessagingService.

The first byte picks the RPC; the rest is the request as protobuf bytes (seeds are valid
requests, see ``seed_requests``; the fuzzer mutates them, or sends anything). A request
that does not parse is gRPC's business (it answers UNKNOWN before the service sees it), so
it is skipped here. Contract for everything that parses: the service answers with its
response type and never logs an ERROR (its guard logs one for an exception a handler let
escape, i.e. a bug), and asyncio's exception handler is never reached.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

TOPIC, FIFO_TOPIC, GROUP, FIFO_GROUP = "FuzzT", "FuzzF", "FuzzG", "FuzzGF"
DELAY_TOPIC = "FuzzD"


class _Context:
    """What the service reads of a call (the endpoint's ``_Call``)."""

    def __init__(self, client_id: str) -> None:
        self.meta = (("x-mq-client-id", client_id),) if client_id else ()
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> Any:
        return self.meta

    def time_remaining(self) -> float:
        return 0.05

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    async def abort(self, code: Any, details: str = "", trailing_metadata: Any = ()) -> None:
        """The call ends with this status (the proxy ends a Telemetry stream so for
        settings it refuses)."""
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def methods() -> list[tuple[str, Any, bool]]:
    """(RPC, request class, server streaming) in the order the first byte picks."""
    from idemp.broker.v5.schema import pb

    return [
        ("QueryRoute", pb.QueryRouteRequest, False),
        ("Heartbeat", pb.HeartbeatRequest, False),
        ("SendMessage", pb.SendMessageRequest, False),
        ("QueryAssignment", pb.QueryAssignmentRequest, False),
        ("ReceiveMessage", pb.ReceiveMessageRequest, True),
        ("AckMessage", pb.AckMessageRequest, False),
        ("ForwardMessageToDeadLetterQueue", pb.ForwardMessageToDeadLetterQueueRequest, False),
        ("EndTransaction", pb.EndTransactionRequest, False),
        ("NotifyClientTermination", pb.NotifyClientTerminationRequest, False),
        ("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest, False),
        ("Telemetry", pb.TelemetryCommand, True),
        ("RecallMessage", pb.RecallMessageRequest, False),
    ]


def seed_requests() -> list[bytes]:
    """Valid requests of every RPC, for the seed corpus (first byte: the RPC)."""
    from idemp.broker.v5.recall import build_handle
    from idemp.broker.v5.schema import pb

    r = pb.Resource
    handles = ["0 1 60000 0 0 broker-a 0 0 0", "garbage", "", "0 99999999999999 10 0 1 b 0 0 0"]
    reqs: list[tuple[str, Any]] = []
    for topic in (TOPIC, FIFO_TOPIC, "Missing", "", "%RETRY%x", "bad topic!", DELAY_TOPIC):
        reqs.append(("QueryRoute", pb.QueryRouteRequest(topic=r(name=topic))))
        # a fixed time, as the corpus is content-addressed: refused as too far ahead, and
        # after January 2027 as past; a fuzzed digit makes it a recall that passes
        for recall in (build_handle(DELAY_TOPIC, "broker-a", 1_800_000_000_000, "01"), "x", ""):
            req = pb.RecallMessageRequest(topic=r(name=topic), recall_handle=recall)
            reqs.append(("RecallMessage", req))
        for group in (GROUP, FIFO_GROUP, ""):
            reqs.append(
                (
                    "QueryAssignment",
                    pb.QueryAssignmentRequest(topic=r(name=topic), group=r(name=group)),
                )
            )
            for handle in handles:
                entry = pb.AckMessageEntry(message_id="01", receipt_handle=handle)
                reqs.append(
                    (
                        "AckMessage",
                        pb.AckMessageRequest(
                            group=r(name=group), topic=r(name=topic), entries=[entry]
                        ),
                    )
                )
                reqs.append(
                    (
                        "ChangeInvisibleDuration",
                        pb.ChangeInvisibleDurationRequest(
                            group=r(name=group),
                            topic=r(name=topic),
                            receipt_handle=handle,
                            invisible_duration={"seconds": 10},
                        ),
                    )
                )
            reqs.append(
                (
                    "ReceiveMessage",
                    pb.ReceiveMessageRequest(
                        group=r(name=group),
                        message_queue=pb.MessageQueue(topic=r(name=topic), id=-1),
                        batch_size=4,
                        invisible_duration={"seconds": 15},
                        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                    ),
                )
            )
        for kind, extra in (
            (pb.NORMAL, {}),
            (pb.FIFO, {"message_group": "g1"}),
            (pb.DELAY, {"delivery_timestamp": {"seconds": 4_000_000_000}}),
            (pb.TRANSACTION, {}),
        ):
            sysp = pb.SystemProperties(
                message_id="0102FC00000001", message_type=kind, tag="A", keys=["k"], **extra
            )
            msg = pb.Message(
                topic=r(name=topic),
                body=b"body",
                system_properties=sysp,
                user_properties={"p": "v"},
            )
            reqs.append(("SendMessage", pb.SendMessageRequest(messages=[msg])))
        reqs.append(
            (
                "EndTransaction",
                pb.EndTransactionRequest(
                    topic=r(name=topic),
                    message_id="01",
                    transaction_id="7F00000100002A9F0000000000000000",
                    resolution=pb.COMMIT,
                ),
            )
        )
        reqs.append(
            (
                "ForwardMessageToDeadLetterQueue",
                pb.ForwardMessageToDeadLetterQueueRequest(
                    group=r(name=GROUP), topic=r(name=topic), receipt_handle=handles[0]
                ),
            )
        )
    reqs.append(
        ("Heartbeat", pb.HeartbeatRequest(group=r(name=GROUP), client_type=pb.SIMPLE_CONSUMER))
    )
    reqs.append(("NotifyClientTermination", pb.NotifyClientTerminationRequest(group=r(name=GROUP))))
    settings = pb.Settings(
        client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription(group=r(name=GROUP))
    )
    reqs.append(("Telemetry", pb.TelemetryCommand(settings=settings)))
    publish = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[r(name=TOPIC)]))
    reqs.append(("Telemetry", pb.TelemetryCommand(settings=publish)))
    names = [m[0] for m in methods()]
    return [bytes([names.index(name)]) + req.SerializeToString() for name, req in reqs]  # fmt: skip


class GrpcHarness:
    """One broker (its store, topics and groups), the MessagingService called directly."""

    def __init__(self) -> None:
        from idemp.broker.config import BrokerConfig
        from idemp.broker.metadata import SubscriptionGroupConfig, TopicConfig
        from idemp.broker.server import BrokerServer
        from idemp.broker.v5 import service as service_module

        service_module.MIN_LONG_POLL_MS = 0  # an empty receive answers at once, not in 5 s
        self.tmp = tempfile.TemporaryDirectory(prefix="idemp-fuzz5-")
        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.loop_errors.append(ctx))
        cfg = BrokerConfig(
            storePathRootDir=str(Path(self.tmp.name) / "store"),
            listenPort=0,
            namesrvAddr="127.0.0.1:0",
            maxMessageSize=64 * 1024,
            recallMessageEnable=True,
        )
        self.server = BrokerServer(cfg)
        self.loop.run_until_complete(self.server.start())
        store = self.server.store
        assert store is not None and self.server.grpc is not None
        store.topics.put(TopicConfig(TOPIC, 2, 2))
        store.topics.put(TopicConfig(FIFO_TOPIC, 2, 2, attributes={"message.type": "FIFO"}))
        store.topics.put(TopicConfig(DELAY_TOPIC, 2, 2, attributes={"message.type": "DELAY"}))
        store.groups.put(SubscriptionGroupConfig(FIFO_GROUP, consumeMessageOrderly=True))
        self.rpcs = self.server.grpc.service.rpcs()
        self.methods = methods()
        self.errors = _Errors()
        logging.getLogger("idemp.broker").addHandler(self.errors)
        logging.getLogger("idemp.broker").propagate = False

    def __call__(self, data: bytes) -> None:
        if not data:
            return
        name, request_class, _ = self.methods[data[0] % len(self.methods)]
        try:
            request = request_class.FromString(data[1:])
        except DecodeError:
            return  # gRPC answers UNKNOWN before the service is called
        context = _Context("" if len(data) > 1 and data[1] == 0xFF else "fuzz-client")
        rpc = self.rpcs[name]  # what the endpoint calls, guard included

        async def call() -> list[Any]:
            if rpc.kind == "bidi":

                async def commands() -> AsyncIterator[Any]:
                    yield request

                return [r async for r in rpc.fn(commands(), context)]
            if rpc.kind == "server_stream":
                return [r async for r in rpc.fn(request, context)]
            return [await rpc.fn(request, context)]

        try:
            responses = self.loop.run_until_complete(asyncio.wait_for(call(), 10))
        except grpc.aio.AbortError:  # a status, not a crash: only for refused settings
            assert context.aborted is not None
            code, why = context.aborted
            refused = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL)
            assert name == "Telemetry" and code in refused, why
            responses = []
        for response in responses:
            response.SerializeToString()
        self.raise_errors(name)

    def raise_errors(self, what: str) -> None:
        """A logged ERROR or a call of asyncio's exception handler is a bug."""
        if self.errors.records:
            rec = self.errors.records[:]
            self.errors.records.clear()
            raise AssertionError(
                f"{what}: the service logged an error: {rec[0].getMessage()}"
            ) from (rec[0].exc_info[1] if rec[0].exc_info else None)
        if self.loop_errors:
            ctx = self.loop_errors[:]
            self.loop_errors.clear()
            raise AssertionError(f"asyncio exception handler: {ctx[0].get('message')}")


_harness: GrpcHarness | None = None


def shared_harness() -> GrpcHarness:
    """One broker per process, for this target and fuzz/http2.py's."""
    global _harness
    if _harness is None:
        _harness = GrpcHarness()
    return _harness


def grpc5(data: bytes) -> None:
    shared_harness()(data)
