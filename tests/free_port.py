"""A TCP port no process listens on now, for local launches (torchrun's master, a one-process
DDP's MASTER_PORT). Fixed numbers collided when two test processes ran at once."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
