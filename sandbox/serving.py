"""Serve ASGI apps on ports of the sandbox's address from inside one asyncio loop.

Every sandbox URL (Hub, CDN, control plane, each Cloud Run service and tag URL) is its own port, so a client
sees a real origin. Sockets are bound before the server starts, so the URL is known at once.

The sandbox's address (``sandbox_host``) is 127.0.0.1, except inside ``python -m sandbox.netns --address CIDR``: there
it is that private address, so that Cloud Run job tasks, which run in network namespaces of their own
(sandbox/control/run/task_netns.py), reach the sandbox as a real job reaches Google's APIs, and never the loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

LOOPBACK = "127.0.0.1"  # this namespace's own loopback: where the sandbox's service instances listen, behind it


def sandbox_host() -> str:
    """The address every sandbox server binds and puts in its URLs: the private address ``python -m sandbox.netns
    --address`` gave its namespace (env ``SANDBOX_NETNS_ADDRESS``, with ``SANDBOX_NETNS=1``), else 127.0.0.1."""
    from sandbox.netns import ADDRESS_ENV, in_private_namespace  # light: no import cycle, read per call

    address = os.environ.get(ADDRESS_ENV, "") if in_private_namespace() else ""
    return address or LOOPBACK


def private_address() -> str | None:
    """The namespace's private address when the sandbox serves on it (job tasks then get namespaces of their own)."""
    host = sandbox_host()
    return None if host == LOOPBACK else host


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening TCP socket on the sandbox's address, ``sandbox_host()`` (a free port when ``port`` is 0)."""
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then; with proto 0 every
    # response waits ~40 ms on Nagle plus delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((sandbox_host(), port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Run in a child before it execs (``preexec_fn``, or in the child itself): on Linux the kernel sends it SIGTERM
    when the process (thread) that started it dies, however that one dies, so no emulator or engine outlives the
    sandbox or test that started it (prctl PR_SET_PDEATHSIG, kept across execve)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _proc_stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a Linux process, from /proc; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def _descendants(pid: int) -> list[tuple[int, int]]:
    """Every process started under ``pid``, as (pid, start time), whatever session it moved to: Prefect's runner
    starts the flow in a session of its own, out of reach of a group-wide signal. [] where there is no /proc."""
    children: dict[int, list[tuple[int, int]]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (stat := _proc_stat(entry.name)) is not None:
                children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


async def stop_process_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """Stop a container as Cloud Run does: SIGTERM to its process group, SIGKILL ``grace_s`` later. The whole group
    goes (what the main process started too), and only right after the stop, while the group id cannot have been
    given to another process. So do the processes the container started in sessions of their own: on Cloud Run they
    die with the container, and here one would otherwise live on (a timed-out job's flow still staging, holding its
    service's lock)."""
    if process.returncode is not None:
        return
    strays = _descendants(process.pid)  # found now: once their parent has gone they are init's
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(process.wait()), timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid, started in strays:
        stat = _proc_stat(pid)
        if stat is not None and stat[1] == started:  # the same process, not a new one given its pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    await process.wait()


def free_port(host: str = LOOPBACK) -> int:
    """A port of ``host`` that was free a moment ago (for child processes that bind it themselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class _SignalFreeServer(uvicorn.Server):
    """uvicorn would take over SIGINT/SIGTERM; the sandbox process owns them and runs many servers."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


@dataclass
class ServedApp:
    """An ASGI app served on one loopback socket by a uvicorn server running as a task."""

    name: str
    url: str
    server: uvicorn.Server
    task: asyncio.Task = field(repr=False)
    # The ASGI app as given to serve_app, so the same object can be served again elsewhere (the TLS face).
    app: Any = field(default=None, repr=False)

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), timeout=5)
        if not self.task.done():
            self.task.cancel()


async def serve_app(
    app,
    name: str,
    port: int = 0,
    *,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> ServedApp:
    """Start serving ``app`` on the sandbox's address (``sandbox_host()``) and return once it accepts connections.

    With ``ssl_certfile`` and ``ssl_keyfile`` (PEM) it speaks HTTPS and its URL is ``https://``.
    """
    sock = bind_loopback(port)
    config = uvicorn.Config(
        app,
        log_level=logging.WARNING,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
        # The Hub and Cloud Run front ends see bursts of parallel downloads and probes.
        backlog=512,
        # uvicorn wraps pre-bound sockets too: Server.startup passes config.ssl to loop.create_server(sock=...).
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    server = _SignalFreeServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"serve-{name}")
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    host, bound_port = sock.getsockname()
    scheme = "https" if config.is_ssl else "http"
    return ServedApp(name=name, url=f"{scheme}://{host}:{bound_port}", server=server, task=task, app=app)
