"""Adapter for RocketMQ 5's official Python client (``rocketmq-python-client``, gRPC).

Two ways to run a decorated listener on it:

- ``listener(fn, group=...)`` gives a ``rocketmq.MessageListener`` for a
  ``PushConsumer``. Its ``consume`` never raises: an ack is ``SUCCESS``, anything else
  (a failure, a claim still held by another consumer, a held transition) is ``FAILURE``,
  after which the client changes the message's invisible duration to its group's backoff
  and the broker hands it out again with the next delivery attempt.
- ``consume(consumer, fn, group=...)`` runs a ``SimpleConsumer`` loop: receive, run the
  listener on each message, ack what it acks; a message it does not ack stays invisible
  until ``invisible_duration`` runs out (or ``retry_after`` seconds, if given) and comes
  back.

Under POP a message whose invisible time runs out while its first handler still works is
handed to another consumer. The decorators' claim makes that second delivery report "in
progress" (not acked, not run again); give the claim a deadline longer than the handler
can take, and an invisible duration at least as long, so the first handler finishes
before anyone may take its claim over (docs/rocketmq5.md).

The client installs a top-level ``rocketmq`` module, as the 4.x wheel does: install this
one with the ``rocketmq5`` extra in a virtualenv without the ``rocketmq`` extra.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from idemp.message import Answer, ConsumeResult, Message, answer_of

logger = logging.getLogger("idemp.adapters.rocketmq5")
RECEIVE_RETRY_S = 1.0
# how long ``consume`` waits for the server's settings before its first receive
SETTINGS_WAIT_S = 10.0


def to_message(received: Any, *, group: str) -> Message:
    """The 5.x client's received ``Message`` as an ``idemp.Message``."""
    attempt = int(received.delivery_attempt or 1)
    properties = dict(received.properties or {})
    return Message(
        topic=received.topic,
        body=bytes(received.body or b""),
        keys=tuple(sorted(received.keys or ())),
        tags=received.tag,
        properties=properties,
        msg_id=received.message_id or "",
        reconsume_times=attempt - 1,
        born_timestamp=int(received.born_timestamp or 0),
        consumer_group=group,
        message_group=received.message_group,
        delivery_attempt=attempt,
        receipt_handle=received.receipt_handle,
        delivery_timestamp=received.delivery_timestamp,
    )


def _check_group(group: object, where: str) -> str:
    if not isinstance(group, str) or not group.strip():
        raise ValueError(
            f"{where}(group={group!r}): pass the consumer group; it names the dedup "
            "namespace of every message"
        )
    return group


def _result(fn: Callable[[Message], Any], received: Any, group: str) -> Answer:
    message: Message | None = None
    try:
        message = to_message(received, group=group)
        return answer_of(fn(message))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: B036 - a listener error must not ack
        logger.error(
            "listener failed, message will come back: msg_id=%s topic=%s",
            message.msg_id if message else "?",
            message.topic if message else "?",
            exc_info=exc,
        )
        return ConsumeResult.RECONSUME_LATER


def listener(fn: Callable[[Message], Any], *, group: str) -> Any:
    """A ``rocketmq.MessageListener`` running ``fn(message)`` for a ``PushConsumer``.

    ``DEAD_LETTER`` (a guarded transition held ``max_holds`` times) is returned as
    ``FAILURE``: the client has no way to dead-letter a message at once, so it comes back
    until its group's maximum delivery attempts, then goes to ``%DLQ%<group>``.
    """
    group = _check_group(group, "listener")
    from rocketmq import ConsumeResult as Result5  # the optional dependency, at wrap time
    from rocketmq import MessageListener

    class IdempListener(MessageListener):
        def consume(self, message: Any) -> Any:
            if _result(fn, message, group) is ConsumeResult.SUCCESS:
                return Result5.SUCCESS
            return Result5.FAILURE

    return IdempListener()


class PushRunner:
    """A decorated listener on the 5.x ``PushConsumer``, with the start/shutdown of idemp's
    runners, for ``App`` listeners declared with ``protocol="grpc"``."""

    def __init__(
        self,
        fn: Callable[[Message], Any],
        *,
        group: str,
        endpoint: str,
        threads: int | None,
        credentials: tuple[str, str] = ("", ""),
    ) -> None:
        """``credentials``: an access key and secret for a proxy with authentication on
        (the 5.x client signs each call with them); empty, none is sent."""
        self.group = _check_group(group, "PushRunner")
        self.endpoint = endpoint
        self._credentials = credentials
        self.threads = threads
        self.subscriptions: dict[str, tuple[str, str]] = {}
        self.consumer: Any = None
        self._busy = 0
        self._lock = threading.Lock()

        def counted(message: Message) -> Any:
            with self._lock:
                self._busy += 1
            try:
                return fn(message)
            finally:
                with self._lock:
                    self._busy -= 1

        self._fn = counted

    def subscribe(self, topic: str, tags: str = "*", expression_type: str = "TAG") -> None:
        """``tags``, or with ``expression_type="SQL92"`` a selector over properties."""
        if expression_type not in ("TAG", "SQL92"):
            raise ValueError(f"expression_type {expression_type!r} is not one of TAG, SQL92")
        self.subscriptions[topic] = (tags, expression_type)

    def start(self) -> None:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, PushConsumer
        from rocketmq.grpc_protocol import FilterType

        ak, sk = self._credentials
        config = ClientConfiguration(self.endpoint, Credentials(ak, sk) if ak else Credentials())
        kinds = {"TAG": FilterType.TAG, "SQL92": FilterType.SQL}
        subs = {t: FilterExpression(e, kinds[k]) for t, (e, k) in self.subscriptions.items()}
        options = {} if self.threads is None else {"consumption_thread_count": self.threads}
        consumer = PushConsumer(
            config, self.group, listener(self._fn, group=self.group), subs, **options
        )
        consumer.startup()
        self.consumer = consumer

    def in_flight(self) -> int:
        return self._busy

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop receiving and wait up to ``timeout`` seconds for running handlers; what is
        received and not acked becomes visible again at the broker (not lost)."""
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.05)  # the handlers run on the client's threads
        consumer.shutdown()


def _await_settings(consumer: Any) -> None:
    """Wait until the server's settings reached ``consumer``, or ``SETTINGS_WAIT_S``.

    RocketMQ 5's proxy answers a receive that comes before them with 50001 "settings is
    null" (the client's ``startup`` waits for them only for a PushConsumer): without this
    the first receive of a loop started right after ``startup`` could fail. The client
    marks their arrival with an event; a client without it is not waited for."""
    arrived = getattr(consumer, "_init_settings_event", None)
    if not isinstance(arrived, threading.Event):
        return
    if not arrived.wait(SETTINGS_WAIT_S):
        logger.warning("no settings from the server after %.0f s; receiving", SETTINGS_WAIT_S)


def consume(
    consumer: Any,
    fn: Callable[[Message], Any],
    *,
    group: str,
    invisible_duration: int = 30,
    max_messages: int = 16,
    retry_after: int | None = None,
    stop: threading.Event | None = None,
    rounds: int | None = None,
    ack_threads: int = 8,
) -> dict[str, int]:
    """Receive with ``consumer`` (a started ``SimpleConsumer``) and run ``fn`` on each
    message until ``stop`` is set (or for ``rounds`` receives); return the counts.

    ``invisible_duration`` (seconds, at least 10 on RocketMQ 5) is how long a received
    message stays hidden from every other consumer of the group. A message ``fn`` does
    not ack is left to come back when that runs out, or after ``retry_after`` seconds, or
    after the ``after`` of the :class:`~idemp.message.ReconsumeLater` it returned.

    The handlers run one after the other, in the order received; their acks go out
    beside them, ``ack_threads`` at a time (the client's ack is one call per message that
    waits for its answer: sequential, a batch spent most of its time waiting for them),
    and all of a batch's are answered before the next receive.
    """
    group = _check_group(group, "consume")
    if ack_threads < 1:
        raise ValueError(f"ack_threads must be at least 1, not {ack_threads!r}")
    stop = stop or threading.Event()
    counts = {"acked": 0, "later": 0, "receives": 0, "errors": 0}
    _await_settings(consumer)
    done = 0
    with ThreadPoolExecutor(ack_threads, thread_name_prefix="idemp-ack") as acks:
        while not stop.is_set() and (rounds is None or done < rounds):
            done += 1
            counts["receives"] += 1
            try:
                batch = consumer.receive(max_messages, invisible_duration)
            except Exception as exc:  # the broker away or restarting: try again shortly
                counts["errors"] += 1
                logger.warning("receive failed (%s); retrying in %.0f s", exc, RECEIVE_RETRY_S)
                stop.wait(RECEIVE_RETRY_S)
                continue
            answers: list[tuple[Any, bool, Future[Any]]] = []  # (message, an ack?, its answer)
            for received in batch:
                said = _result(fn, received, group)
                if said is ConsumeResult.SUCCESS:
                    answers.append((received, True, acks.submit(consumer.ack, received)))
                    continue
                counts["later"] += 1
                # a ReconsumeLater(after=...) says when; RocketMQ 5 counts whole seconds
                after = getattr(said, "after", None) or retry_after
                if after is not None:
                    hidden = max(1, math.ceil(after))
                    change = acks.submit(consumer.change_invisible_duration, received, hidden)
                    answers.append((received, False, change))
            for received, is_ack, answer in answers:
                try:
                    answer.result()
                except Exception as exc:
                    # the ack (or change) failed, e.g. the message became visible and went
                    # to another consumer meanwhile: it comes back, and the effect, already
                    # recorded, makes that delivery a duplicate
                    counts["errors"] += 1
                    logger.warning("ack of %s failed: %s", received.message_id, exc)
                    continue
                if is_ack:
                    counts["acked"] += 1
    return counts
