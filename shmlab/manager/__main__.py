"""``python -m shmlab.manager``: run the shm manager daemon (the starter reads its first line).

Introspection and the leak checkers recognise a daemon by the ``shmlab.manager`` in its command
line, so this is the one way it is started (``client._start_manager`` does exactly this).
"""

import sys

from shmlab.manager.daemon import main

sys.exit(main())
