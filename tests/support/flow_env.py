"""The ``flow_env`` fixture, for every tier that runs the flows against the session's sandbox (tests/e2e,
tests/reliability, tests/engine): a pytest plugin, registered in tests/conftest.py's ``pytest_plugins``.

It asks for ``sandbox`` by name, so a tier that starts its own sandbox (tests/engine's, on the real engine) gets
blocks for that one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.region import services_deleted_after


@pytest.fixture(scope="session")
def flow_env(sandbox, prefect_api):
    """Blocks for the sandbox saved (the GcpTarget as "sandbox" and as "production"), and the Hub stand-in as
    HF_ENDPOINT, as `python -m sandbox blocks` does."""
    import os
    from pathlib import Path

    from sandbox.blocks import save_sandbox_blocks

    target = save_sandbox_blocks(Path(sandbox.info["state_dir"]))
    # The flows' default target is "production" (what bootstrap saves): here the sandbox is that project, so a
    # test that names no target runs against it, as a user's run would against theirs.
    target.save("production", overwrite=True)
    previous = os.environ.get("HF_ENDPOINT")
    os.environ["HF_ENDPOINT"] = sandbox.hub_url
    yield target
    if previous is None:
        os.environ.pop("HF_ENDPOINT", None)
    else:
        os.environ["HF_ENDPOINT"] = previous


@pytest.fixture(autouse=True)
def region_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that runs flows leaves the region as it found it: the Cloud Run services it made are deleted after it
    (their instances stop). The sandbox is a new project, whose quotas (20 vCPU, 40 GiB) hold one L4 instance, and
    preflight counts what runs in the region (tasks/checks/in_use.py): an earlier test's service, left up, would
    take the next test's room. Services made before the test (a module's shared service) stay."""
    if "flow_env" not in request.fixturenames:
        yield
        return
    with services_deleted_after(request.getfixturevalue("flow_env")):
        yield
