import sys

from mservd.cli import main

sys.exit(main())
