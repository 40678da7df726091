"""A real `prefect server start` for tests that go the way users do: CLI commands, deployments, workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from sandbox.serving import free_port

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")


@contextmanager
def prefect_server(
    home: Path, host: str = "127.0.0.1", server_env: dict[str, str] | None = None, **extra_env: str
) -> Iterator[dict[str, str]]:
    """A server with its own database under ``home``, listening on ``host``; yields the environment a CLI command or
    worker needs. ``server_env`` goes to the server alone (its own settings, such as its auth string: a worker copies
    every Prefect setting of its environment into the jobs it creates)."""
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://{host}:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **extra_env,
    }
    log = (home / "server.log").open("wb")
    process = subprocess.Popen([PREFECT, "server", "start", "--host", host, "--port", str(port)],
                               env={**env, **(server_env or {})}, stdout=log, stderr=subprocess.STDOUT,
                               cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # about 12 s idle; far longer when the cores are shared
        while time.monotonic() < deadline:
            assert process.poll() is None, (home / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise TimeoutError(f"prefect server did not start; see {home / 'server.log'}")
        yield env
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def run_command(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A CLI command in the project folder; its output is in the assertion message when it fails."""
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done
