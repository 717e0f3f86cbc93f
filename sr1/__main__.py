"""`python -m sr1` = `sr1`."""

import sys

from sr1.cli import main

sys.exit(main())
