"""The shm manager: a daemon that unlinks a process family's file_system segments after it dies.

Mirrors: torch/lib/libshm (torch_shm_manager and the client side in libshm.so)

    protocol.py    what the manager hears: request lines, names, options  (socket.h, alloc_info.h)
    connection.py  one connection: REGISTER, FREE, STATUS, WATCH          (socket.h ClientSocket)
    client.py      this process's managers: start lazily, one client each  (core.cpp)
    daemon.py      the daemon itself: its loop, grace clock, shutdown     (manager.cpp)
    requests.py    what REGISTER, FREE, STATUS, WATCH, BYE do; events      (manager.cpp)
    conns.py       one accepted connection: inbox, outbox, back-pressure  (ClientSession)
    liveness.py    which members live: SO_PEERCRED pids, pidfd, start time  (torch: none)
    eventlog.py    events.jsonl, size-capped and rotated; refusal rate limit (torch: none)
    faults.py      stalls, observer floods, big STATUS: for tests and stress (torch: none)
    __main__.py    ``python -m shmlab.manager [--grace S] [--max-clients N]`` runs the daemon

Nothing is imported here: ``storage`` imports ``client`` only when a process first shares a
storage with the file_system strategy, and the daemon imports only what it serves with.
"""
