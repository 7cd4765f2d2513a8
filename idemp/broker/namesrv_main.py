"""``idemp namesrv``: a nameserver alone, as RocketMQ's mqnamesrv.

For clusters of several brokers (``idemp broker --no-namesrv``, or RocketMQ's) whose
nameserver must outlive any one of them: a broker killed in a failover test takes
only itself away. The handlers are the embedded nameserver's (``namesrv``), run by a
``BrokerServer`` that has no store and listens on one port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from . import namesrv
from .config import BrokerConfig
from .kvconfig import NamesrvState
from .main import run_loop, serve
from .process import arm_from_environment
from .server import BrokerServer

DEFAULT_KV_CONFIG = Path("~/namesrv/kvConfig.json")  # NamesrvConfig.kvConfigPath


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen-port", type=int, default=9876, help="port (default 9876; 0: free)")
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--kv-config",
        default=str(DEFAULT_KV_CONFIG),
        help="the KV config file, as RocketMQ's kvConfigPath (~/namesrv/kvConfig.json)",
    )
    p.add_argument("--log-level", default="WARNING", help="logging level name (default WARNING)")


class NamesrvServer(BrokerServer):
    """A BrokerServer with the nameserver's listener only: no store, no broker port."""

    def __init__(self, port: int, bind: str, kv_config: Path) -> None:
        config = BrokerConfig(namesrvAddr=f"{bind}:{port}", bindAddress=bind, grpcServerPort=-1)
        super().__init__(config)
        self.kv_config = kv_config

    async def start(self) -> None:
        self.tls.check()
        self.namesrv = NamesrvState(self.kv_config)
        namesrv.register(self.namesrv_handlers)
        self.namesrv_addr = await self._listen_namesrv(self.config.bindAddress)
        self._tasks = [asyncio.get_running_loop().create_task(self._scan_brokers())]


def run(args: argparse.Namespace) -> int:
    arm_from_environment()
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not 0 <= args.listen_port <= 65535:
        print(f"idemp namesrv: --listen-port {args.listen_port} is not a TCP port", file=sys.stderr)
        return 2
    return run_loop(_serve(args.listen_port, args.bind, Path(args.kv_config).expanduser()))


async def _serve(port: int, bind: str, kv_config: Path) -> int:
    return await serve(
        "namesrv",
        lambda: NamesrvServer(port, bind, kv_config),
        lambda server: f"idemp namesrv ready namesrv={server.namesrv_addr} kv={kv_config}",
    )
