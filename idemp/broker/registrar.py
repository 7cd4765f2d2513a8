"""A broker without its own nameserver registers with the ones of ``namesrvAddr``.

As RocketMQ's BrokerController: every topic at start, again every
``registerNameServerPeriod`` (10-60 s) so the nameservers keep it alive, at once when a
topic changes, and UNREGISTER_BROKER on a clean stop. With ``forceRegister=false`` a
periodic round first asks QUERY_DATA_VERSION and sends the topics only where they
changed. A nameserver that is down is retried on the next round; one that refuses the
first registration stops the start (a misconfiguration, said once, not every 30 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode

from .config import ConfigError
from .link import RemotingLink
from .metadata import topic_json
from .namesrv import apply_order_topics
from .registration import body_crc32, encode_register_body, registered_perm

if TYPE_CHECKING:
    from .context import Broker

log = logging.getLogger("idemp.broker.registrar")


class Registrar:
    def __init__(self, server: Broker, opaques: Any) -> None:
        self.server = server
        cfg = server.config
        self.links = [RemotingLink(a, opaques, "nameserver") for a in cfg.namesrv_addrs]
        self.period = max(10.0, min(cfg.registerNameServerPeriod, 60_000) / 1000)
        self.timeout = cfg.registerBrokerTimeoutMills / 1000
        self.topics_changed = asyncio.Event()
        assert server.store is not None
        server.store.topics.listeners.append(self.topics_changed.set)

    def _identity(self) -> dict[str, str]:
        cfg = self.server.config
        return {
            "brokerName": cfg.brokerName,
            "brokerAddr": self.server.broker_addr,
            "clusterName": cfg.brokerClusterName,
            "brokerId": str(cfg.brokerId),
        }

    def _body(self) -> tuple[bytes, dict[str, Any]]:
        """registerBrokerAll's topics: a broker that is not read-write registers every
        topic with the broker's permission."""
        store, cfg = self.server.store, self.server.config
        assert store is not None
        topics = {}
        for name, tc in store.topics.topics.items():
            raw = topic_json(tc)
            raw["perm"] = registered_perm(cfg.brokerPermission, tc.perm)
            topics[name] = raw
        version = store.topics.version.to_json()
        return encode_register_body(topics, version, cfg.compressedRegister), version

    async def start(self) -> None:
        """The first registration; a refusal is a ConfigError naming the nameserver."""
        for link, outcome in zip(self.links, await self._register_all(force=True)):
            if isinstance(outcome, RemotingCommand) and outcome.code != ResponseCode.SUCCESS:
                raise ConfigError(
                    f"nameserver {link.addr} refused the registration: "
                    f"{outcome.remark or outcome.code}"
                )

    async def after_registering(self, answer: RemotingCommand) -> RemotingCommand:
        """A topic created by an admin request is registered before the request is
        answered, so a route asked for next has it (RocketMQ's updateTopic)."""
        self.topics_changed.clear()
        await self._register_all(force=True)
        return answer

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time() + self.period
        while True:
            try:
                await asyncio.wait_for(
                    self.topics_changed.wait(), max(0.0, next_round - loop.time())
                )
                self.topics_changed.clear()
                await self._register_all(force=True)
            except asyncio.TimeoutError:
                next_round = loop.time() + self.period
                await self._register_all(force=self.server.config.forceRegister)

    async def _register_all(self, force: bool) -> list[RemotingCommand | BaseException | None]:
        body, version = self._body()
        fields = {
            **self._identity(),
            "haServerAddr": f"{self.server.config.brokerIP1}:{self.server.config.listenPort + 1}",
            "compressed": "true" if self.server.config.compressedRegister else "false",
            "bodyCrc32": str(body_crc32(body)),
        }

        async def one(link: RemotingLink) -> RemotingCommand | None:
            if not force and not await self._changed(link, version):
                return None
            answer = await link.request(RequestCode.REGISTER_BROKER, fields, body, self.timeout)
            if answer.code == ResponseCode.SUCCESS:
                self._apply_order_table(answer)
            else:
                log.warning("nameserver %s refused the registration: %s", link.addr, answer.remark)
            return answer

        outcomes = await asyncio.gather(*(one(link) for link in self.links), return_exceptions=True)
        for link, outcome in zip(self.links, outcomes):
            if isinstance(outcome, BaseException):
                log.warning("register with nameserver %s: %s", link.addr, outcome or type(outcome))
        return list(outcomes)

    async def _changed(self, link: RemotingLink, version: dict[str, Any]) -> bool:
        answer = await link.request(
            RequestCode.QUERY_DATA_VERSION,
            self._identity(),
            json.dumps(version, separators=(",", ":")).encode(),
            self.timeout,
        )
        return answer.ext_fields.get("changed", "true") != "false"

    def _apply_order_table(self, answer: RemotingCommand) -> None:
        if not answer.body:
            return
        try:
            table = json.loads(answer.body).get("table")
        except ValueError:
            return
        if isinstance(table, dict):
            apply_order_topics(self.server, {str(k): str(v) for k, v in table.items()})

    async def stop(self) -> None:
        """UNREGISTER_BROKER with each nameserver (3 s each, as RocketMQ)."""

        async def one(link: RemotingLink) -> None:
            try:
                await link.request(RequestCode.UNREGISTER_BROKER, self._identity(), b"", 3.0)
            except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
                log.warning("unregister from nameserver %s: %s", link.addr, exc)
            finally:
                link.close()

        await asyncio.gather(*(one(link) for link in self.links))
