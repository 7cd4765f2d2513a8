"""Adapters that wrap third-party RocketMQ clients (e.g. the official C++ one) for idemp."""
