"""``python -m mservd.worker SPEC_JSON``: one worker in a fresh interpreter, for debugging a
handler (the daemon forks its workers from the zygote instead)."""

import sys

from mservd.worker.main import main

sys.exit(main())
