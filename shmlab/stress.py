"""``python -m shmlab.stress`` keeps working: the tool lives in ``shmlab.tools.stress``."""
from shmlab.tools.stress import main

if __name__ == "__main__":
    raise SystemExit(main())
