"""A TCP relay to a local server that a test can cut and mend: an outage of that server as its clients see it (every
connection dropped, new ones closed at once), without stopping the server itself."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CuttableProxy:
    """Relays 127.0.0.1:``port`` to ``target_port``; ``cut()`` drops every connection until ``mend()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="cuttable-proxy").start()

    def cut(self) -> None:
        with self._lock:
            self._cut.set()
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def mend(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not on Linux)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                upstream.settimeout(None)  # the timeout was for connecting: a slow answer is no outage
            except OSError:
                client.close()
                continue
            with self._lock:  # cut() shuts what is registered under the same lock: none slips through
                if self._cut.is_set():
                    client.close()
                    upstream.close()
                    continue
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink, source is client), daemon=True).start()

    def _sent(self, connection: socket.socket, chunk: bytes) -> None:
        """What a client sent on ``connection``, on its way to the server (a subclass may look at it)."""

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool = False) -> None:
        try:
            while chunk := source.recv(65536):
                if from_client:
                    self._sent(source, chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(source)
            source.close()


@contextlib.contextmanager
def cuttable_proxy(target_port: int) -> Iterator[CuttableProxy]:
    proxy = CuttableProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
