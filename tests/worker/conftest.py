"""Worker tests reuse the client fixtures (idemp's broker as a child process)."""

from tests.client.conftest import broker, make_broker  # noqa: F401
