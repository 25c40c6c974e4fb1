import sys

from mservd.cli.commands import main

sys.exit(main())
