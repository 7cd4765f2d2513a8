"""Runner tests reuse the client fixtures (broker child process, consume processes)."""

from tests.client.conftest import broker, consumers, make_broker  # noqa: F401
