"""One settings model: backends by URL, deadlines, retention, strategy per listener.

From code (``IdempSettings(backend="redis://…")``), the environment (``IDEMP_BACKEND``,
``IDEMP_DEADLINE_S``, ``IDEMP_LISTENERS__orders__BACKEND`` …) or a TOML file
(``IdempSettings.from_toml("idemp.toml")``, or the file named by ``IDEMP_CONFIG``; the
environment still wins). Changing the backend is configuration only:
``settings.strategy_for("orders")`` (and ``@idempotent(strategy="orders")``) builds
whatever the URL names. URLs carry passwords: ``repr()`` and every log line show them
masked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from idemp.strategies.base import Strategy
from idemp.strategies.unique_key import valid_identifier
from idemp.urls import mask_url as mask_url  # re-exported: users import it from here

StrategyName = Literal[
    "unique_key", "redis_flag", "optimistic_version", "pessimistic_row_lock", "redisson_lock"
]
_REDIS_STRATEGIES = ("redis_flag", "redisson_lock")


def _strategy_for_scheme(url: str) -> StrategyName:
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        return "redis_flag"
    return "unique_key"


class ListenerSettings(BaseModel):
    """Overrides for one listener (by its name); unset fields fall back to the globals."""

    backend: str | None = Field(default=None, repr=False)
    strategy: StrategyName | None = None
    deadline_s: float | None = None
    retention_s: float | None = None
    transactional: bool | None = None
    table: str | None = None

    def __repr_args__(self) -> Any:
        yield from super().__repr_args__()
        if self.backend is not None:
            yield "backend", mask_url(self.backend)


class IdempSettings(BaseSettings):
    """Where and how listeners deduplicate, from code, ``IDEMP_*`` environment variables or a
    TOML file (``IdempSettings.from_toml``), in that order of precedence.

    ``backend`` (a SQLAlchemy or ``redis://`` URL, default ``sqlite:///idemp.db``),
    ``strategy`` (default: from the URL's scheme), ``deadline_s`` (60: how long a claim
    holds before another consumer may take it over), ``retention_s`` (7 days),
    ``transactional``, ``table``, ``key_prefix``, ``lock_timeout_s``, ``namesrv``,
    ``endpoint``, ``namespace``, the ACL account (``access_key``, ``secret_key``), ``use_tls``,
    ``tls_ca_file``, ``trace`` (message traces), ``instance`` (this instance's name, for
    broadcasting listeners); ``listeners``
    overrides any of them per listener name (``IDEMP_LISTENERS__orders__BACKEND=...``).
    ``strategy_for(name)`` builds the strategy a listener should use.
    """

    model_config = SettingsConfigDict(
        env_prefix="IDEMP_", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    backend: str = Field(default="sqlite:///idemp.db", repr=False)
    strategy: StrategyName | None = None  # None: chosen from the backend URL's scheme
    deadline_s: float = Field(default=60.0, gt=0)
    retention_s: float = Field(default=7 * 86400.0, gt=0)
    transactional: bool = False
    table: str = "idemp_dedup"
    key_prefix: str = "idemp"
    lock_timeout_s: float = Field(default=5.0, gt=0)
    listeners: dict[str, ListenerSettings] = Field(default_factory=dict)
    namesrv: str | None = None  # the nameserver an App's listeners consume from
    endpoint: str | None = None  # the RocketMQ 5 proxy (gRPC) of an App's grpc listeners
    # the Java client's namespace: an App's topics and groups are ``<namespace>%<name>``
    namespace: str = ""
    # RocketMQ ACL: the account an App's listeners sign their requests with
    access_key: str = ""
    secret_key: str = Field(default="", repr=False)
    security_token: str = Field(default="", repr=False)
    # TLS to the nameserver and brokers, and message traces of an App's listeners
    use_tls: bool = False
    tls_ca_file: str = ""
    trace: bool = False
    # this instance's name, stable across its restarts and its own: a broadcasting
    # listener keeps its offsets and dedup records under it
    instance: str = ""

    toml_path: ClassVar[Path | None] = None  # set by from_toml on a throw-away subclass

    @field_validator("instance")
    @classmethod
    def _instance_name(cls, value: str) -> str:
        # it names a directory of offsets and a dedup namespace: no separators in it
        if value and not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(f"instance {value!r}: letters, digits, '.', '_' and '-' only")
        return value

    @field_validator("table")
    @classmethod
    def _table_name(cls, value: str) -> str:
        return valid_identifier(value)

    def __repr_args__(self) -> Any:
        yield "backend", mask_url(self.backend)
        yield from super().__repr_args__()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Code beats the environment, which beats a file (see from_toml).
        toml = cls.toml_path
        if toml is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml))

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> IdempSettings:
        """Settings from a TOML file (top-level keys as the field names); environment
        variables and ``overrides`` take precedence over the file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"idemp settings file not found: {path}")
        subclass = type(cls.__name__, (cls,), {"toml_path": path})
        return subclass(**overrides)

    @classmethod
    def load(cls, **overrides: Any) -> IdempSettings:
        """The settings of this process: the TOML file named by ``IDEMP_CONFIG`` (if
        set), then the environment, then ``overrides``."""
        path = os.environ.get("IDEMP_CONFIG")
        return cls.from_toml(path, **overrides) if path else cls(**overrides)

    # -- building strategies ----------------------------------------------------------
    def strategy_named(self, name: str) -> Strategy:
        """``@idempotent(strategy="orders")``: the strategy configured under that name
        (``[listeners.orders]`` in TOML, ``IDEMP_LISTENERS__orders__…``); ``"default"``
        is the global one. An unknown name is an error, not a silent default."""
        if name == "default":
            return self.strategy_for(None)
        if name not in self.listeners:
            known = ", ".join(sorted(["default", *self.listeners]))
            raise ValueError(
                f"strategy {name!r} is not configured: set IDEMP_LISTENERS__{name}__BACKEND "
                f"(or [listeners.{name}] in the IDEMP_CONFIG file); configured: {known}"
            )
        return self.strategy_for(name)

    def for_listener(self, name: str | None) -> dict[str, Any]:
        """The effective settings of one listener (globals + its overrides)."""
        merged: dict[str, Any] = {
            "backend": self.backend,
            "strategy": self.strategy,
            "deadline_s": self.deadline_s,
            "retention_s": self.retention_s,
            "transactional": self.transactional,
            "table": self.table,
        }
        if name is not None and name in self.listeners:
            for field, value in self.listeners[name].model_dump(exclude_none=True).items():
                merged[field] = value
        return merged

    def strategy_for(self, listener: str | None = None) -> Strategy:
        """Build the strategy configured for ``listener`` (or the global one)."""
        eff = self.for_listener(listener)
        return build_strategy(
            eff["backend"],
            strategy=eff["strategy"],
            deadline_s=eff["deadline_s"],
            retention_s=eff["retention_s"],
            transactional=eff["transactional"],
            table=valid_identifier(eff["table"]),
            prefix=self.key_prefix,
            lock_timeout_s=self.lock_timeout_s,
        )


def build_strategy(
    url: str,
    *,
    strategy: StrategyName | None = None,
    deadline_s: float = 60.0,
    retention_s: float = 7 * 86400.0,
    transactional: bool = False,
    table: str = "idemp_dedup",
    prefix: str = "idemp",
    lock_timeout_s: float = 5.0,
) -> Strategy:
    """A strategy from a backend URL and options; the URL's scheme picks the strategy
    unless ``strategy`` names one."""
    from idemp.strategies import (
        OptimisticVersion,
        PessimisticRowLock,
        RedisFlag,
        RedissonLock,
        UniqueKeyTable,
    )

    name = strategy or _strategy_for_scheme(url)
    on_redis = _strategy_for_scheme(url) == "redis_flag"
    if name in _REDIS_STRATEGIES:
        if not on_redis:
            raise ValueError(
                f"{name} needs a redis:// or redis+cluster:// URL, not {mask_url(url)}"
            )
        if name == "redisson_lock":
            return RedissonLock(url, prefix=prefix)
        return RedisFlag(url, deadline_s=deadline_s, retention_s=retention_s, prefix=prefix)
    if on_redis:
        raise ValueError(f"{name} needs a SQL URL, not {mask_url(url)}")
    if name == "optimistic_version":
        return OptimisticVersion(url, lock_timeout_s=lock_timeout_s)
    if name == "pessimistic_row_lock":
        return PessimisticRowLock(url, lock_timeout_s=lock_timeout_s)
    return UniqueKeyTable(
        url,
        table=table,
        deadline_s=deadline_s,
        retention_s=retention_s,
        transactional=transactional,
        lock_timeout_s=lock_timeout_s,
    )


def strategy_from_url(url: str, **options: Any) -> Strategy:
    """``@idempotent(strategy="redis://…")``: defaults for everything but the URL; a
    string without ``://`` is a name configured in the settings (``strategy_named``)."""
    if "://" not in url and not options:
        return IdempSettings.load().strategy_named(url)
    return build_strategy(url, **options)
