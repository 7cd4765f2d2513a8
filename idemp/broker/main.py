"""``idemp broker``: run the broker until SIGTERM, printing one line when ready."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from .admin_config import unheeded
from .config import BrokerConfig, ConfigError, load_config
from .process import arm_from_environment
from .server import BrokerServer

log = logging.getLogger("idemp.broker")

# command-line flag -> broker.conf key
FLAG_KEYS = {
    "namesrv_addr": "namesrvAddr",
    "embedded_namesrv": "embeddedNamesrv",
    "listen_port": "listenPort",
    "store": "storePathRootDir",
    "broker_ip": "brokerIP1",
    "broker_name": "brokerName",
    "cluster": "brokerClusterName",
    "flush_disk_type": "flushDiskType",
    "bind": "bindAddress",
    "grpc_port": "grpcServerPort",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="a RocketMQ broker.conf file")
    p.add_argument(
        "-n",
        "--namesrv-addr",
        help="host:port the embedded nameserver listens on; with --no-namesrv, the "
        "nameservers to register with (host:port;host:port)",
    )
    p.add_argument(
        "--no-namesrv",
        dest="embedded_namesrv",
        action="store_const",
        const="false",
        help="run no nameserver here: register with the ones of -n (idemp namesrv, "
        "another idemp broker's, or RocketMQ's) as RocketMQ's broker does",
    )
    p.add_argument("--listen-port", type=int, help="broker port (0 picks a free one)")
    p.add_argument("--store", help="storePathRootDir")
    p.add_argument("--broker-ip", help="brokerIP1, the address advertised to clients")
    p.add_argument("--broker-name", help="brokerName (default broker-a)")
    p.add_argument("--cluster", help="brokerClusterName (default DefaultCluster)")
    p.add_argument(
        "--flush-disk-type",
        choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
        help="SYNC_FLUSH: fsync before SEND_OK (default ASYNC_FLUSH)",
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        help="RocketMQ 5 clients' gRPC port (default 8081, 0 a free one, -1 off)",
    )
    p.add_argument("--bind", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "-p",
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any broker.conf key, overriding the file",
    )
    p.add_argument("--log-level", default="WARNING", help="logging level name (default WARNING)")


def overrides_from(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--property {item!r} is not KEY=VALUE")
        out[key.strip()] = value
    for attr, key in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = str(value)
    return out


def run(args: argparse.Namespace) -> int:
    arm_from_environment()  # started by BrokerProcess: go when it goes
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config, overrides_from(args))
    except ConfigError as exc:
        print(f"idemp broker: {exc}", file=sys.stderr)
        return 2
    for key in unheeded(config):
        log.warning("broker.conf: %s=%s is not acted on by idemp", key, config.unknown[key])
    return run_loop(_serve(config))


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop where it is installed (Python 3.10 has no asyncio.Runner)."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(config: BrokerConfig) -> int:
    def ready(server: BrokerServer) -> str:
        assert server.store is not None
        return (
            f"idemp broker ready namesrv={server.namesrv_addr} broker={server.broker_addr} "
            f"grpc={server.grpc_addr or 'off'} "
            f"store={config.storePathRootDir} flush={config.flushDiskType} "
            f"recovered={server.store.recovered_messages}"
        )

    return await serve("broker", lambda: BrokerServer(config), ready)


async def serve(
    name: str, make: Callable[[], BrokerServer], ready: Callable[[BrokerServer], str]
) -> int:
    """Start, print the ready line, run until SIGTERM or SIGINT, stop: ``idemp broker``
    and ``idemp namesrv`` alike. A port taken exits 1, a bad setting 2."""
    try:
        server = make()
        await server.start()
    except OSError as exc:
        print(f"idemp {name}: cannot listen: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:  # the ACL file and the TLS settings, checked at start
        print(f"idemp {name}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(ready(server), flush=True)
    await stop.wait()
    await server.stop()
    print(f"idemp {name} stopped", flush=True)
    return 0
