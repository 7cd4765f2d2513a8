"""idemp: exactly-once effects and per-key order for RocketMQ consumers."""

__version__ = "0.1.0"
