"""``idemp demo``: ride-hailing order events with injected faults, consumed exactly once
and in order, then reconciled. See :mod:`idemp.demo.run`."""

from idemp.demo.run import add_arguments, run_demo

__all__ = ["add_arguments", "run_demo"]
