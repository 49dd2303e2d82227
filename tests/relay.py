"""A TCP relay between a receiver and its broker that a test can freeze, cut or close:
a broker (or network) that stops answering, drops a connection or goes away, at the
moment the test chooses instead of whenever the broker gets round to it."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class FreezableRelay:
    """Relays every connection made to ``url`` to the broker at the given URL.

    Frozen, it reads neither side while both sockets stay open, so nothing moves. When
    one side closes, the other is closed too, as a proxy does; a connection made while
    the broker is down is closed at once, as a refused one would be."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        self.url = urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._pumps = 0
        self._paused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the broker is down: the caller sees a refused connection
                continue
            upstream.settimeout(None)
            with self._lock:
                self.socks += [client, upstream]
                self._pumps += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """Both directions in one thread; while frozen nothing is read, so nothing moves."""
        peer = {a: b, b: a}
        try:
            while not self.closed.is_set():
                if self.frozen.is_set():
                    with self._lock:
                        self._paused += 1
                    while self.frozen.is_set() and not self.closed.is_set():
                        time.sleep(0.02)
                    with self._lock:
                        self._paused -= 1
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._pumps -= 1
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        """Stop relaying; returns once no connection is being read on either side."""
        self.frozen.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self._lock:
                if self._paused >= self._pumps:
                    return
            time.sleep(0.01)
        raise AssertionError("the relay did not pause")

    def thaw(self) -> None:
        """Relay again: what either side sent meanwhile moves on, closes included."""
        self.frozen.clear()

    def drop(self) -> None:
        """End the relayed connections (both ends see them close); new ones still pass."""
        with self._lock:
            socks, self.socks = self.socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Drop both sides at once: the broker sees the connection go."""
        self.closed.set()
        with self._lock:
            socks = [self.listener, *self.socks]
        for s in socks:
            s.close()
