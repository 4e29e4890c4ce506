"""``python -m memstaged``."""

import sys

from memstaged.cli.main import main

sys.exit(main())
