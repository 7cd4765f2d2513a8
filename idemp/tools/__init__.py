"""Command-line tools on idemp's client: ``idemp produce`` and ``idemp consume``."""
