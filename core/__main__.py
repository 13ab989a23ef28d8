import sys

from faultcast.cli import main

sys.exit(main())
