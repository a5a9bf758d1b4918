"""``python -m objectcache``: the same as the ``objectcache`` command."""

import sys

from .cli import main

sys.exit(main())
