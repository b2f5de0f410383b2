"""`python -m shmlab.drill`, the same as `python -m shmlab drill`: the interview drill in a
terminal (see shmlab.drill.cli)."""

import sys

from .cli import main

sys.exit(main())
