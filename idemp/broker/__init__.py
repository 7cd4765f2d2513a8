"""idemp's minimal RocketMQ broker: nameserver and broker in one process, for tests,
CI and demos. Production runs real RocketMQ."""

from .config import BrokerConfig, ConfigError, load_config
from .server import BrokerServer

__all__ = ["BrokerConfig", "BrokerServer", "ConfigError", "load_config"]
