"""A Cloud Run job task's own network, when the sandbox serves on a private address (``sandbox_host``).

Inside ``python -m sandbox.netns --address CIDR`` (call its namespace N0) the sandbox and the team's Prefect server
listen on that private address. Each task attempt then runs in a network namespace of its own (N1: ``unshare
--net`` from N0), joined to N0 by a veth pair with a /30 of ``LINK_POOL`` and a default route via N0's end. From
the task the private address is reachable (N0 owns it: no forwarding needed), and 127.0.0.1 is the task's own
loopback, as on Cloud Run, where a job never reaches the loopback of the machine that started it.

``TaskLink.claim()`` picks a free /30 and link name; ``wrap`` gives the argv that runs the shim
(sandbox/control/run/task_netns.py) under ``unshare --net``; once that process runs, ``plumb`` moves the link's far
end into its namespace, and ``release`` deletes the pair (deleting one end deletes both).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# Link addresses of the tasks: a /30 each (N0's end, the task's end). Outside 10.99.0.0/24, the address
# `make worker-e2e` gives N0; a different --address must not overlap it either.
LINK_POOL = ipaddress.ip_network("10.99.128.0/17")
TASK_INTERFACE = "eth0"  # the name the task sees, as a container's
SHIM = Path(__file__).with_name("task_netns.py")
NAMESPACE_WAIT_S = 120.0  # how long unshare (and the shim, for its link) may take, on a loaded 2-core machine
_in_use: set[int] = set()


class TaskNetworkError(RuntimeError):
    """The task's network could not be made (the message says which step and why)."""


def _ip() -> str:
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if ip is None:
        raise TaskNetworkError("job tasks need iproute2's ip(8) for their own network namespace: install iproute2")
    return ip


def _net_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass
class TaskLink:
    """One attempt's veth pair: ``host_name`` in N0 with ``gateway``, ``TASK_INTERFACE`` in N1 with ``address``."""

    index: int
    host_name: str
    gateway: str
    address: str  # with its prefix length
    plumbed: bool = False

    @classmethod
    def claim(cls) -> TaskLink:
        """The next free /30 of ``LINK_POOL`` and its link name (released by ``release``)."""
        count = LINK_POOL.num_addresses // 4
        index = next((i for i in range(count) if i not in _in_use), None)
        if index is None:
            raise TaskNetworkError(f"all {count} task links of {LINK_POOL} are in use")
        _in_use.add(index)
        base = LINK_POOL.network_address + 4 * index
        return cls(index, f"sbj{index}", str(base + 1), f"{base + 2}/30")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by the shim in a new network namespace (a child of this one)."""
        from sandbox.netns import unshare_argv  # the same flags the runner found to work here

        shim = [sys.executable, "-I", "-S", str(SHIM), "--ip", _ip(), "--interface", TASK_INTERFACE]
        shim += ["--address", self.address, "--gateway", self.gateway, "--wait-s", f"{NAMESPACE_WAIT_S:g}"]
        return [*unshare_argv(("--net",)), "--", *shim, "--", *argv]

    async def plumb(self, process: asyncio.subprocess.Process) -> None:
        """Once ``process`` has its own namespace, give it the link's far end; address and raise N0's end."""
        mine = _net_ns("self")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NAMESPACE_WAIT_S
        while (theirs := _net_ns(process.pid)) == mine:
            if process.returncode is not None or theirs is None or loop.time() > deadline:
                raise TaskNetworkError(f"the task's process never got its own network namespace (unshare --net, "
                                       f"exit status {process.returncode})")  # fmt: skip
            await asyncio.sleep(0.005)
        commands = (
            f"link add {self.host_name} type veth peer name {TASK_INTERFACE} netns {process.pid}\n"
            f"addr add {self.gateway}/30 dev {self.host_name}\n"
            f"link set {self.host_name} up\n"
        )
        self.plumbed = True  # set first: a batch that fails halfway still leaves a pair for release to delete
        await self._ip_batch(commands)

    async def release(self) -> None:
        """Delete the pair (if the task's namespace has not taken it down already) and free the /30."""
        try:
            if self.plumbed:
                await self._ip_batch(f"link del {self.host_name}\n", check=False)
        finally:
            _in_use.discard(self.index)

    async def _ip_batch(self, commands: str, check: bool = True) -> None:
        process = await asyncio.create_subprocess_exec(
            _ip(), "-batch", "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await process.communicate(commands.encode())
        if check and process.returncode != 0:
            raise TaskNetworkError(f"ip -batch: {err.decode(errors='replace').strip()} (commands: {commands!r})")
