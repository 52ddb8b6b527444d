"""``python -m replaystore.cli``: the ``replaystore`` command."""

import sys

from replaystore.cli import main

sys.exit(main())
