"""``python -m lapidus`` is the ``lapidus`` command."""

import sys

from .cli import main

sys.exit(main())
