"""A loopback TCP port for a server a test starts in another process.

The port is drawn at random below the kernel's ephemeral range (32768-60999 on Linux), which
outgoing connections and ``bind(0)`` draw from: a port found by binding port 0 can be taken by
another process (a second test suite beside this one, a connection) before the server binds
it. Below that range only another test's explicit pick can collide, and the draw makes that
unlikely; the port is checked free when drawn.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000


def free_port() -> int:
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW, HIGH)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in [{LOW}, {HIGH}) after 200 tries")
