"""A TCP proxy that stops answering: it passes N requests, then black-holes or trickles.

It sits between a client and a real server (moto's S3 server on loopback) at the socket
level, so the client meets a real stall on the wire: a connection that stays open and never
answers (``blackhole``), or an answer that arrives one byte every half second (``trickle``).
Requests are counted by their HTTP/1.1 request lines.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Literal

Mode = Literal["blackhole", "trickle"]
TRICKLE_S = 0.5


class StallingProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.requests = 0
        self.stall_from: int | None = None  # the first request (by count) that stalls
        self.mode: Mode = "blackhole"
        self.held = 0  # requests that met the stall
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def stall(self, *, after: int = 0, mode: Mode = "blackhole") -> None:
        """Pass ``after`` more requests, then stall every later one."""
        with self.lock:
            self.stall_from = self.requests + after + 1
            self.mode = mode

    def heal(self) -> None:
        """New requests pass again (those held stay held until their connection closes)."""
        with self.lock:
            self.stall_from = None

    def _stalled(self, data: bytes) -> tuple[bool, Mode]:
        """Count the request lines in ``data``; whether this chunk belongs to the stall."""
        with self.lock:
            lines = data.count(b" HTTP/1.1\r\n")
            self.requests += lines
            stalled = self.stall_from is not None and self.requests >= self.stall_from
            if stalled and lines:
                self.held += lines
            return stalled, self.mode

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"trickle": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        """Client to server: a stalled request is swallowed (black hole) or marked (trickle)."""
        try:
            while data := client.recv(65536):
                stalled, mode = self._stalled(data)
                if stalled and mode == "blackhole":
                    continue  # the server never hears of it: no answer, ever
                state["trickle"] = stalled
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        """Server to client: as it comes, or one byte per ``TRICKLE_S`` while trickling."""
        try:
            while data := server.recv(65536):
                if not state["trickle"]:
                    client.sendall(data)
                    continue
                for i in range(len(data)):
                    client.sendall(data[i : i + 1])
                    time.sleep(TRICKLE_S)
        except OSError:
            pass
        finally:
            _close(client, server)

    def close(self) -> None:
        self.listener.close()


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.close()
