"""idemp test suite."""
