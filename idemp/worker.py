"""``idemp worker module:app``: run an :class:`idemp.app.App` in the foreground.

Until SIGTERM or SIGINT: then it stops pulling, lets in-flight handlers finish within
``--shutdown-timeout``, commits offsets, unlocks its orderly queues at the broker (so
another instance takes them at once) and exits 0. A second signal exits at once (code
1) and says what was abandoned: those messages were not acked and come back.

``--http-port`` serves ``/livez``, ``/readyz`` (200 once every listener holds its
subscriptions, 503 while starting or stopping) and ``/metrics`` (Prometheus: idemp's
counters, per-listener consume latency, lag and in-flight messages). The HTTP server is
the standard library's: three GET routes need no framework.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is built without importing the runners
    from idemp.app import App

log = logging.getLogger("idemp.worker")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", metavar="MODULE:APP", help="where the App object is, e.g. svc:app")
    p.add_argument("--namesrv", help="nameserver host:port (else IDEMP_NAMESRV or the App's)")
    p.add_argument(
        "--instance",
        help="this instance's name, kept across restarts (else IDEMP_INSTANCE or the App's); "
        "broadcast=True listeners keep their offsets and dedup records under it",
    )
    p.add_argument(
        "--endpoint",
        help="RocketMQ 5 proxy host:port for protocol='grpc' listeners (else IDEMP_ENDPOINT)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        help="serve /livez, /readyz and /metrics on this port (0 picks a free one)",
    )
    p.add_argument("--http-host", default="127.0.0.1", help="address the HTTP port binds")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight handlers get to finish after SIGTERM (default 30)",
    )
    p.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="log lines as text or JSON"
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.add_argument(
        "--ready-file",
        help="write the HTTP port and the pid here once ready (for process supervisors)",
    )
    p.add_argument(
        "--reload",
        action="store_true",
        help="development: restart the worker when a .py or .toml file changes "
        "(needs the reload extra, watchfiles)",
    )
    p.add_argument(
        "--reload-dir",
        action="append",
        metavar="DIR",
        help="with --reload: a directory to watch (repeatable; default the current one)",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the error)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line)


def load_app(target: str) -> App:
    """``module:attribute`` → the App (the current directory is importable)."""
    from idemp.app import App

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{target!r}: expected MODULE:APP, e.g. orders.service:app")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ValueError(f"{target!r}: {module_name}.{attr} is not an idemp App ({app!r})")
    return app


class Metrics:
    """Prometheus series for the app's listeners (``prometheus-client``, the ``metrics``
    extra); idemp's per-message counters are ``idemp_events_total``."""

    def __init__(self, app: App) -> None:
        from prometheus_client import REGISTRY, Gauge, Histogram

        self.registry = REGISTRY
        latency = Histogram("idemp_consume_seconds", "time in a listener per message", ["listener"])
        lag = Gauge("idemp_lag_messages", "stored, not yet consumed by this worker", ["listener"])
        flight = Gauge("idemp_in_flight_messages", "pulled, not yet acked", ["listener"])
        queues = Gauge("idemp_queues_held", "queues consumed (orderly: locked)", ["listener"])
        for spec in app.listeners:
            spec.latency = latency.labels(spec.name)
            lag.labels(spec.name).set_function(spec.lag)
            flight.labels(spec.name).set_function(spec.in_flight)
            queues.labels(spec.name).set_function(spec.queues_held)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


def serve_http(app: App, host: str, port: int, metrics: Metrics | None) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            path = self.path.split("?", 1)[0]
            if path == "/livez":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/readyz":
                ready = app.ready()
                ok = all(ready.values()) and not app.stopping
                self._send(200 if ok else 503, json.dumps(ready).encode(), "application/json")
            elif path == "/metrics" and metrics is not None:
                self._send(200, metrics.render(), "text/plain; version=0.0.4")
            elif path == "/metrics":
                self._send(404, b"install idemp[metrics] (prometheus-client)\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # probes every few seconds: not worth a log line each

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="idemp-http", daemon=True).start()
    return server


def configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler], force=True)


def run(args: argparse.Namespace) -> int:
    configure_logging(args)
    if getattr(args, "reload", False):
        from idemp.reload import run_reloading

        return run_reloading(args)
    try:
        app = load_app(args.app)
        if args.namesrv:
            app._namesrv = args.namesrv
        if args.instance:
            app.name_instance(args.instance)
        if args.endpoint:
            app._endpoint = args.endpoint
        metrics = _metrics(app)
        server = (
            serve_http(app, args.http_host, args.http_port, metrics)
            if args.http_port is not None
            else None
        )
        stop = threading.Event()
        signals = {"count": 0}

        def on_signal(signum: int, frame: Any) -> None:
            signals["count"] += 1
            if signals["count"] == 1:
                log.info("idemp event=stopping signal=%s", signal.Signals(signum).name)
                stop.set()
                return
            left = {s.name: s.in_flight() for s in app.listeners}
            # through the log handler, so that --log-format json keeps every line JSON
            log.error(
                "idemp worker: second signal, exiting now; abandoned in-flight messages "
                "(not acked, they come back): %s",
                json.dumps(left),
            )
            os._exit(1)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        began = time.monotonic()
        app.start()
    except Exception as exc:  # configuration: one line, secrets masked, before consuming
        print(f"idemp worker: {_one_line(exc)}", file=sys.stderr)
        return 2
    port = server.server_address[1] if server is not None else None
    log.info(
        "idemp event=ready app=%s listeners=%d seconds=%.2f http_port=%s",
        app.name,
        len(app.listeners),
        time.monotonic() - began,
        port,
    )
    if args.ready_file:
        Path(args.ready_file).write_text(json.dumps({"pid": os.getpid(), "http_port": port}))
    while not stop.wait(0.5):  # a bounded wait: the signal handler runs between waits
        pass
    began = time.monotonic()
    app.stop(args.shutdown_timeout)
    if server is not None:
        server.shutdown()
    log.info("idemp event=stopped app=%s seconds=%.2f", app.name, time.monotonic() - began)
    return 0


def _one_line(exc: BaseException) -> str:
    from idemp.urls import mask_url

    return mask_url((str(exc).strip().splitlines() or [type(exc).__name__])[0])


def _metrics(app: App) -> Metrics | None:
    try:
        return Metrics(app)
    except ImportError:
        log.warning("prometheus-client is not installed: /metrics answers 404")
        return None
