"""``python -m rsock.bench``: see ``rsock.bench`` for what it measures."""

import sys

from rsock.bench import main

sys.exit(main())
