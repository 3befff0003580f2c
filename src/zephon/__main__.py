"""``python -m zephon``: the ``zephon`` command (importing :mod:`zephon` has installed its
start-up signal handlers already)."""

import sys

from zephon.cli import main

sys.exit(main())
