"""The test Prefect API at an address of this host that is not loopback, as a team's server is.

Prefect's test harness serves on 127.0.0.1 only (``SubprocessASGIServer``), and a cloud-run-v2 pool is refused a
loopback PREFECT_API_URL (tasks/checks/api_reach.py). ``forwarded`` relays TCP from the host's own address (the
source address of its default route) to the harness's port, so a client configured with that address really reaches
the API through it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import socketserver
import threading
from collections.abc import Iterator

# TEST-NET-3 (RFC 5737): connecting a UDP socket sends nothing; the kernel only chooses the route's source address.
_ANY_REMOTE = ("203.0.113.1", 9)


def host_address() -> str:
    """This host's non-loopback IPv4 address (its default route's source); RuntimeError naming why when none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ANY_REMOTE)
            address = probe.getsockname()[0]
    except OSError as exc:
        raise RuntimeError(f"this host has no route off loopback ({exc}): no address to serve the API on") from None
    if ipaddress.ip_address(address).is_loopback:
        raise RuntimeError(f"this host's default route leaves from {address}, a loopback address")
    return address


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass  # the other side closed: end this direction too
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def forwarded(upstream_port: int, host: str) -> Iterator[int]:
    """A relay on ``host`` (a free port, yielded) to 127.0.0.1:``upstream_port``, closed on exit."""

    class Relay(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with socket.create_connection(("127.0.0.1", upstream_port), timeout=60) as upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
                back.start()
                _pump(self.request, upstream)
                back.join()

    server = socketserver.ThreadingTCPServer((host, 0), Relay)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
