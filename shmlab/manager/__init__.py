"""The shm manager: a daemon that unlinks a process family's file_system segments after it dies.

Mirrors: torch/lib/libshm (torch_shm_manager and the client side in libshm.so)

Client side (runs in every process that shares with file_system):
    client.py       this process's managers: ManagerClient (REGISTER, FREE, STATUS), one per
                    manager, started lazily and forgotten on fork; watch() and peek_status()
                    observe a manager without keeping it alive   (core.cpp, socket.h ClientSocket)
    peer.py         is a handle a shmlab manager of our own user? (manager.cpp's uid check)
    errors.py       ManagerError, NotAManagerError                (the runtime_errors libshm throws)
Both sides:
    protocol.py     what the manager hears: request lines, names, options (socket.h, alloc_info.h)
Daemon side (runs in `python -m shmlab.manager`, started by client.py):
    daemon.py       Manager: torch's story (REGISTER, FREE, grace, unlink), then its extensions
                    (paged STATUS, WATCH and events, fair service); main()       (manager.cpp)
    daemon_conn.py  one accepted connection: inbox, outbox, back-pressure      (ClientSession)
    liveness.py     which members live: SO_PEERCRED pids, pidfd, start time    (torch: none)
    eventlog.py     events.jsonl, size-capped and rotated; refusal rate limit  (torch: none)
    __main__.py     ``python -m shmlab.manager [--grace S] [--max-clients N]`` runs the daemon
Not here: the faults tests and the stress tool throw at a manager are ``shmlab.testing.faults``.

Nothing is imported here. ``shmlab.storage`` imports ``client`` at import time (see Note
[Forking while the first share is in flight] in storage.py); daemon.py imports nothing from
the client side.
"""
