"""Shared fixtures: one sandbox process and one Prefect harness for the whole session."""

from __future__ import annotations

import os

# Before huggingface_hub is imported anywhere: no Xet, no telemetry, never the real Hub.
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # a closed port: a test that forgets endpoint= fails loudly
os.environ.pop("HF_TOKEN", None)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.handle import SandboxHandle


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxHandle]:
    """A running sandbox (all stand-ins on loopback) shared by the session; faults are reset per test."""
    state_dir: Path = tmp_path_factory.mktemp("sandbox")
    handle = SandboxHandle.start(state_dir)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def sb(sandbox: SandboxHandle) -> Iterator[SandboxHandle]:
    """The session sandbox with no faults left over from another test."""
    sandbox.clear_faults()
    yield sandbox
    sandbox.clear_faults()


@pytest.fixture(scope="session")
def sandbox_target(sandbox: SandboxHandle):
    """A GcpTarget pointing at the session sandbox (what `python -m sandbox up` prints)."""
    from blocks.target import GcpTarget

    return GcpTarget.model_validate(sandbox.target)


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test harness (a temporary API server and database) for the whole session."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(), temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
