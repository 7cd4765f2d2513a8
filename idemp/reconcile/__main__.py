"""``python -m idemp.reconcile …`` and ``spark-submit idemp/reconcile/__main__.py …``."""

import sys

from idemp.reconcile.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
