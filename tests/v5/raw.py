"""Raw gRPC calls to a RocketMQ 5 endpoint, with idemp's own protobuf classes: requests
no official client would send (malformed, forged, over the limits)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc

from idemp.broker.v5.schema import SERVICE, pb

METADATA = (
    ("x-mq-client-id", "raw-client@test"),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
    ("x-mq-client-version", "5.1.2"),
)


class Raw:
    def __init__(self, addr: str, client_id: str | None = None) -> None:
        """``client_id``: a real proxy keeps a client's settings across test runs, so a
        test that needs a client without settings brings an id of its own."""
        self.channel = grpc.insecure_channel(addr)
        self.metadata = METADATA
        if client_id is not None:
            self.metadata = (("x-mq-client-id", client_id), *METADATA[1:])

    def close(self) -> None:
        self.channel.close()

    def unary(self, method: str, request: Any, response: Any, *, metadata: Any = None) -> Any:
        call = self.channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=_bytes_of,
            response_deserializer=response.FromString,
        )
        return call(request, metadata=self.metadata if metadata is None else metadata, timeout=30)

    def stream(self, method: str, request: Any, response: Any) -> list[Any]:
        call = self.channel.unary_stream(
            f"/{SERVICE}/{method}",
            request_serializer=_bytes_of,
            response_deserializer=response.FromString,
        )
        return list(call(request, metadata=self.metadata, timeout=40))

    def receive_one(self, group: str, topic: str, invisible_s: int = 30) -> Any:
        """As a SimpleConsumer: its settings, then one ReceiveMessage (a 5 s long poll)
        of the one message it must find."""
        settings, request = simple_consumer(group, topic)
        assert self.first_telemetry(settings).status.code == pb.OK
        request.invisible_duration.seconds = invisible_s
        request.long_polling_timeout.seconds = 5
        answers = self.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
        (message,) = [a.message for a in answers if a.WhichOneof("content") == "message"]
        return message

    def first_telemetry(self, settings: Any) -> Any:
        """Open a Telemetry stream, send ``settings``, return the first answer (a
        refusal ends the stream: grpc.RpcError), then close the stream."""
        call = self.channel.stream_stream(
            f"/{SERVICE}/Telemetry",
            request_serializer=_bytes_of,
            response_deserializer=pb.TelemetryCommand.FromString,
        )
        done = threading.Event()

        def commands() -> Iterator[Any]:
            yield pb.TelemetryCommand(settings=settings)
            done.wait(30)

        stream = call(commands(), metadata=self.metadata, timeout=30)
        try:
            return next(stream)
        finally:
            done.set()
            stream.cancel()

    def ack(
        self, group: str, topic: str, handle: str, message_id: str = "01"
    ) -> tuple[int, str, list[tuple[int, str]]]:
        """AckMessage of one handle: (code, message, [(entry code, entry message)])."""
        answer = self.unary(
            "AckMessage",
            pb.AckMessageRequest(
                group=resource(group),
                topic=resource(topic),
                entries=[pb.AckMessageEntry(message_id=message_id, receipt_handle=handle)],
            ),
            pb.AckMessageResponse,
        )
        entries = [(e.status.code, e.status.message) for e in answer.entries]
        return answer.status.code, answer.status.message, entries

    def change(
        self, group: str, topic: str, handle: str, message_id: str = "01", seconds: int = 10
    ) -> tuple[int, str]:
        """ChangeInvisibleDuration of one handle: (code, message)."""
        answer = self.unary(
            "ChangeInvisibleDuration",
            pb.ChangeInvisibleDurationRequest(
                group=resource(group),
                topic=resource(topic),
                receipt_handle=handle,
                message_id=message_id,
                invisible_duration={"seconds": seconds},
            ),
            pb.ChangeInvisibleDurationResponse,
        )
        return answer.status.code, answer.status.message

    def forward(
        self, group: str, topic: str, handle: str, message_id: str = "01"
    ) -> tuple[int, str]:
        """ForwardMessageToDeadLetterQueue of one handle: (code, message)."""
        answer = self.unary(
            "ForwardMessageToDeadLetterQueue",
            pb.ForwardMessageToDeadLetterQueueRequest(
                group=resource(group),
                topic=resource(topic),
                receipt_handle=handle,
                message_id=message_id,
                delivery_attempt=1,
                max_delivery_attempts=16,
            ),
            pb.ForwardMessageToDeadLetterQueueResponse,
        )
        return answer.status.code, answer.status.message


def query_route(addr: str, topic: str) -> Any:
    """One QueryRoute of ``topic`` at the endpoint ``addr``, on a connection of its own."""
    raw = Raw(addr)
    try:
        return raw.unary(
            "QueryRoute", pb.QueryRouteRequest(topic=resource(topic)), pb.QueryRouteResponse
        )
    finally:
        raw.close()


def simple_consumer(group: str, topic: str) -> tuple[Any, Any]:
    """A SimpleConsumer's Telemetry settings for ``topic`` (every tag), and its
    ReceiveMessageRequest of one message (the proxy wants the settings first)."""
    everything = pb.FilterExpression(type=pb.TAG, expression="*")
    subscription = pb.Subscription(
        group=resource(group),
        subscriptions=[pb.SubscriptionEntry(topic=resource(topic), expression=everything)],
    )
    request = pb.ReceiveMessageRequest(
        group=resource(group),
        message_queue=pb.MessageQueue(topic=resource(topic)),
        filter_expression=everything,
        batch_size=1,
        invisible_duration={"seconds": 10},
    )
    return pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=subscription), request


def _bytes_of(request: Any) -> bytes:
    return request if isinstance(request, bytes) else bytes(request.SerializeToString())


def resource(name: str) -> Any:
    return pb.Resource(name=name)
