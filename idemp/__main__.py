import sys

from idemp.cli import main

sys.exit(main())
