"""idemp benchmarks: run with ``python -m benchmarks`` (``make bench``)."""
