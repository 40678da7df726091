"""Shared fixtures: one sandbox process and one Prefect harness for the whole session."""

from __future__ import annotations

import contextlib
import os

# Before huggingface_hub is imported anywhere: no Xet, no telemetry, never the real Hub.
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # a closed port: a test that forgets endpoint= fails loudly
os.environ.pop("HF_TOKEN", None)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.handle import SandboxHandle
from sandbox.metadata import point_google_auth_at
from tests.support.region import services_deleted_after
from tests.support.sandbox_config import config_setter

# flow_env, for every tier that runs the flows (e2e, reliability, engine).
pytest_plugins = ["tests.support.flow_env"]

# Before google-auth's metadata module is imported (it reads GCE_METADATA_HOST once; nothing above imports it):
# ID tokens come from the session sandbox's metadata server, as they would from a Cloud Run worker's.
METADATA_PORT = point_google_auth_at()
HARNESS_STARTUP_TIMEOUT_S = 300


@contextlib.contextmanager
def conforming_sandbox(state_dir: Path, *args: str) -> Iterator[SandboxHandle]:
    """A sandbox process for a session; its responses must have kept to Google's discovery schemas throughout."""
    handle = SandboxHandle.start(state_dir, "--metadata-port", str(METADATA_PORT), *args)
    violations: list[dict] = []
    try:
        yield handle
        violations = handle.conformance_violations()
    finally:
        handle.stop()
    # A sandbox that invents or misnames a field in a response fails the session (sandbox.conformance).
    assert not violations, "sandbox responses broke Google's discovery schemas:\n" + "\n".join(
        f"{v['http']} ({v['method']}): {'; '.join(v['problems'])}" for v in violations
    )


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxHandle]:
    """A running sandbox (all stand-ins on loopback) shared by the session; faults are reset per test."""
    with conforming_sandbox(tmp_path_factory.mktemp("sandbox")) as handle:
        yield handle


@pytest.fixture
def sb(sandbox: SandboxHandle) -> Iterator[SandboxHandle]:
    """The session sandbox with no faults left over from another test."""
    sandbox.clear_faults()
    yield sandbox
    sandbox.clear_faults()


def _sandbox_handles(item: pytest.Item) -> list[SandboxHandle]:
    """The sandboxes a test had among its fixtures (``sb`` and ``sandbox`` are one handle)."""
    values = (getattr(item, "funcargs", None) or {}).values()
    return list({id(v): v for v in values if isinstance(v, SandboxHandle)}.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A fault a test injects must fire: an idle rule (a path the product no longer calls, a service misnamed) lets
    the test pass without the failure it was written to survive. Checked when the test body passed, before its
    fixtures clear the rules (the handle kept what a clear in the test removed); a rule that may legitimately stay
    idle is added with ``may_not_fire="why"``."""
    handles = _sandbox_handles(item)
    try:
        result = yield
    except BaseException:
        for handle in handles:
            handle.forget_faults()  # the test failed already, perhaps before its fault's turn
        raise
    unfired = [rule for handle in handles for rule in handle.take_unfired_faults()]
    if unfired:
        pytest.fail(
            "fault rules that never fired (fix the rule, or add it with may_not_fire=reason):\n"
            + "\n".join(
                f"  {r['server']} {r['method'] or '*'} {r['path']!r} ({r['action']}, rule {r['id']})" for r in unfired
            ),
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Rules a fixture added around the test body are not the next test's: the handles forget them."""
    try:
        return (yield)
    finally:
        for handle in _sandbox_handles(item):
            handle.forget_faults()


@pytest.fixture
def ip_hold(sandbox: SandboxHandle) -> Iterator[Callable[[float], dict]]:
    """A setter for how long Cloud Run keeps a deleted service's Direct VPC egress IPs (simulated seconds, the
    sandbox's ``serverless_ip_hold_seconds``); the session's value is restored after the test."""
    with config_setter(sandbox, "serverless_ip_hold_seconds") as set_hold:
        yield set_hold


@pytest.fixture
def iam_propagation(sandbox: SandboxHandle) -> Iterator[Callable[[float], dict]]:
    """A setter for how long a new service account stays unknown to other APIs (simulated seconds, the
    sandbox's ``iam_propagation_seconds``); the session's value is restored after the test."""
    with config_setter(sandbox, "iam_propagation_seconds") as set_propagation:
        yield set_propagation


@pytest.fixture
def grant_propagation(sandbox: SandboxHandle) -> Iterator[Callable[[float], dict]]:
    """A setter for how long a role granted by setIamPolicy takes to count (simulated seconds, the sandbox's
    ``grant_propagation_seconds``); the session's value is restored after the test."""
    with config_setter(sandbox, "grant_propagation_seconds") as set_propagation:
        yield set_propagation


@pytest.fixture
def iam_propagated(iam_propagation: Callable[[float], dict]) -> None:
    """New service accounts visible at once: for tests that bind or deploy one with raw calls (no product wait)
    while testing something else; tests/integration/test_iam_propagation.py covers the window itself."""
    iam_propagation(0)


@pytest.fixture(scope="module", autouse=True)
def module_leaves_region_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module of the default tiers that uses the session sandbox deletes the Cloud Run services it made, when it
    ends: the sandbox is a new project (one L4 instance fills its 40 GiB) and preflight counts what runs in the
    region, so a module's services left up would take the next module's room. (The engine and worker tiers start
    their own sandboxes.)"""
    path = str(request.node.path)
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    if "/tests/engine/" in path or "/tests/worker/" in path or not any("sandbox" in i.fixturenames for i in items):
        yield
        return
    with services_deleted_after(request.getfixturevalue("sandbox_target")):
        yield


@pytest.fixture
def grants_propagated(grant_propagation: Callable[[float], dict]) -> None:
    """Roles granted count at once (a new project's 2 minutes cut to none): for tests that grant with raw calls,
    which have no product wait, while testing something else; test_iam_propagation.py and the product's waits
    (tasks/infra/propagation.py) cover the window itself."""
    grant_propagation(0)


@pytest.fixture
def raised_quota(sandbox: SandboxHandle, sandbox_target) -> Iterator[None]:
    """A project whose Cloud Run quotas were raised for zero-downtime GPU delivery: 40 vCPU, 160 GiB, 3 RTX Pro 6000.
    A new project (20 vCPU, 40 GiB) cannot run a candidate L4 instance (8 vCPU, 32 GiB) beside the serving one, nor
    any RTX Pro 6000 instance (80 GiB): preflight refuses both, saying which quota to request
    (tests/e2e/test_new_project.py). Tests of what happens after that request use this. The services the test made
    are deleted before the quota goes back: what runs under the raised quota would leave the next test no room (the
    worker tier's next job could not start beside two idle L4 instances)."""
    before = sandbox.configure()
    raised = {"cpu_quota": 40, "memory_quota_gib": 160, "gpu_quota": {**before["gpu_quota"], "nvidia-rtx-pro-6000": 3}}
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: 15 minutes have passed
    sandbox.configure(**raised)
    try:
        with services_deleted_after(sandbox_target):
            yield
    finally:
        sandbox.configure(**{key: before[key] for key in raised})


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

    # The server's start is mostly imports and database migrations: about 12 s on an idle 2-core machine, and
    # several times that when other processes share the cores (Prefect's default of 30 s then times out).
    with (
        prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_TIMEOUT_S),
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


@pytest.fixture
def reachable_prefect_api(prefect_api) -> Iterator[str]:
    """PREFECT_API_URL at this host's own non-loopback address, relayed to the harness (tests/support/forward.py):
    the Prefect API as a cloud-run-v2 pool needs it, since a loopback URL is refused (tasks/checks/api_reach.py).
    Yields the URL."""
    from urllib.parse import urlsplit

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.support.forward import forwarded, host_address

    host = host_address()
    with forwarded(urlsplit(PREFECT_API_URL.value()).port, host) as port:
        url = f"http://{host}:{port}/api"
        with temporary_settings({PREFECT_API_URL: url}):
            yield url


# Longest first: `make test` hands each test file to one of its workers in collection order, so a slow file
# collected last would run alone at the end. Files marked slow go first, then the tiers by their usual weight
# (end to end, reliability, integration, unit); the order within a file is kept.
_TIER_ORDER = ("tests/e2e/", "tests/reliability/", "tests/integration/", "tests/unit/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> tuple[int, int]:
        tier = next((i for i, prefix in enumerate(_TIER_ORDER) if item.nodeid.startswith(prefix)), len(_TIER_ORDER))
        return (0 if item.get_closest_marker("slow") else 1, tier)

    items.sort(key=weight)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, a real-component tier (``TIER_SKIPS_FAIL=1``: make test-engine, make worker-e2e) that skipped a test
    did not pass: it proved nothing about what it skipped."""
    if os.environ.get("CI") != "true" or os.environ.get("TIER_SKIPS_FAIL") != "1" or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reasons = sorted({str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
                          for report in skipped})  # fmt: skip
        print(f"\nCI: this tier skipped {len(skipped)} test(s), which fails it: {'; '.join(reasons)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
