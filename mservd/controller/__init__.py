"""The daemon's process: the controller's loop and its I/O shell (the ZeroMQ sockets, the
management verbs, the supervisor that starts workers, the frontend processes, snapshots, the
model store). The state it moves requests by lives in ``core/``, which does no I/O."""
