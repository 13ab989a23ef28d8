"""`python -m faultcast`: the same command line as `faultcast`."""

import sys

from faultcast.cli import main

sys.exit(main())
