"""What a real-engine test reads off the host: which process serves an instance's port, and what it has loaded.

The sandbox logs where it started the real engine (``[sandbox] the real engine: ... listening on 127.0.0.1:P``,
sandbox/vllm/real_engine.py); /proc then says which process holds that listening socket and which shared objects
it mapped. vLLM's compiled extension (``vllm/_C*.so``) is in the engine's processes only: the stand-in never has it.
"""

from __future__ import annotations

import re
from pathlib import Path

from sandbox.handle import SandboxHandle

ENGINE_LINE = re.compile(r"\[sandbox\] the real engine: .* listening on 127\.0\.0\.1:(\d+) \(where Cloud Run sends")
EXTENSION = re.compile(r"/vllm/_C[^/]*\.so$")
LISTEN = "0A"


def revision_log(sandbox: SandboxHandle, revision: str) -> str:
    response = sandbox.admin.get(f"/run/logs/{revision}")
    response.raise_for_status()
    return response.text


def engine_ports(sandbox: SandboxHandle, revision: str) -> list[int]:
    """The published port of each real-engine start of ``revision``, oldest first."""
    return [int(port) for port in ENGINE_LINE.findall(revision_log(sandbox, revision))]


def listening_pid(port: int) -> int | None:
    """The process with a TCP socket listening on ``port`` (IPv4 or IPv6), if any."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == LISTEN:
                inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = fd.readlink().as_posix()
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def loaded_extensions(pid: int) -> set[str]:
    """vLLM's compiled extension files mapped into ``pid``."""
    mapped = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if EXTENSION.search(path):
            mapped.add(path)
    return mapped


def engine_core_pid(api_server_pid: int) -> int | None:
    """vLLM's EngineCore process under ``api_server_pid``: the child whose title is ``VLLM::EngineCore`` (AsyncLLM
    always runs the engine core in a process of its own; vllm/v1/engine/core.py sets the title)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            title = (proc / "cmdline").read_text()
        except (OSError, ValueError, IndexError):
            continue
        if parent == api_server_pid and "EngineCore" in title:
            return int(proc.name)
    return None
