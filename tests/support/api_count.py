"""The requests a process makes to the Prefect API, counted on the wire: a relay in front of the test's server that
reads each HTTP/1.1 request line (the client's default: PREFECT_API_ENABLE_HTTP2 is off) as it passes."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.tcp_proxy import CuttableProxy

# Not anchored to a line start: on a kept-alive connection the next request follows the last body's final byte. A
# JSON body cannot hold a raw CRLF (JSON escapes control characters), so no body is taken for a request line.
REQUEST_LINE = re.compile(rb"(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/\S*) HTTP/1\.[01]\r\n")
TAIL = 2048  # a request line cut between two reads is found in the next one


@dataclass(frozen=True)
class Request:
    at: float  # time.monotonic()
    method: str
    path: str


class CountingProxy(CuttableProxy):
    """Relays to the server and keeps every request line clients sent through it."""

    def __init__(self, target_port: int) -> None:
        self.requests: list[Request] = []
        self._tails: dict[int, bytes] = {}
        self._count_lock = threading.Lock()
        super().__init__(target_port)

    def _sent(self, connection: socket.socket, chunk: bytes) -> None:
        key = id(connection)
        tail = self._tails.get(key, b"")
        data = tail + chunk
        now = time.monotonic()
        found = [Request(now, m.group(1).decode(), m.group(2).decode())
                 for m in REQUEST_LINE.finditer(data) if m.end() > len(tail)]  # fmt: skip
        self._tails[key] = data[-TAIL:]
        with self._count_lock:
            self.requests += found

    def busiest_minute(self) -> list[Request]:
        """The requests of the 60 seconds that held the most of them."""
        with self._count_lock:
            times = sorted(self.requests, key=lambda r: r.at)
        return max((times[i : i + _within_a_minute(times, i)] for i in range(len(times))), key=len, default=[])


def _within_a_minute(times: list[Request], start: int) -> int:
    end = start
    while end < len(times) and times[end].at - times[start].at < 60:
        end += 1
    return end - start


@contextlib.contextmanager
def counting_proxy(target_port: int) -> Iterator[CountingProxy]:
    proxy = CountingProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
