"""``python -m memstaged``."""

import sys

from memstaged.cli import main

sys.exit(main())
