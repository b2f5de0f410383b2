"""``python -m shmlab.bench`` keeps working: the benchmark lives in ``shmlab.tools.bench``."""
from shmlab.tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
