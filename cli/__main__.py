"""`python -m cli ...`: the same as `barge ...`."""

import sys

from cli.main import main

sys.exit(main())
