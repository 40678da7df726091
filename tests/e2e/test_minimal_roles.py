"""The role table of docs/first-run.md is exactly enough: with only those roles the whole lifecycle works, and
without any one of them the flow stops with the missing permission and the role to grant.

The caller's roles live in the sandbox project's IAM policy (sandbox/authz); every API call is checked against
them as Google checks it. One service is promoted with a Cloud Build image and the Hub token in Secret Manager
(so every conditional role is needed); the removal runs reuse it and fail at the first step that needs the role.
Before that promote, doctor runs under the same roles (the table's "doctor (read-only checks)" rows included) and
must find nothing failed: the table's roles are enough to run doctor too.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blocks import GcpTarget, ServingProfile
from flows.doctor import doctor
from flows.promote import promote_model
from flows.rollback import rollback_model
from flows.scale import scale_service
from flows.teardown import teardown
from sandbox.handle import SandboxHandle
from tasks.checks.doctor import Check, DoctorFailed
from tasks.common.permissions import DEPLOYER_ROLES, DOCTOR_ROLES
from tasks.deploy.probe import VerifyOptions
from tests.support.sandbox_config import sandbox_settings

pytestmark = pytest.mark.prefect
FAST = VerifyOptions(health_period_s=0.05)
README_ROLES = [need.role for need in (*DEPLOYER_ROLES, *DOCTOR_ROLES)]  # docs/first-run.md's table, row by row
_ids = itertools.count()


def promote(service: str, profile: str, **kwargs):
    return promote_model(model="sandbox/tiny-chat", service=service, profile=profile,
                         token_secret_block="sandbox-hf-token", verify=FAST, **kwargs)  # fmt: skip


def save_profile(name: str, source: Path, service: str, **overrides) -> str:
    """The l4 preset, building its image from ``source`` and reading the Hub token from Secret Manager at run time."""
    build = {"source_dir": str(source), "image_name": service}
    ServingProfile.preset("l4", image=None, build=build, hf_token_at_runtime=True, **overrides).save(
        name, overwrite=True
    )
    return name


@pytest.fixture(scope="module")
def build_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("minimal-roles-image")
    (folder / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (folder / "app.py").write_text("print('minimal roles')\n")
    return folder


@pytest.fixture(scope="module")
def quota_raised_for_the_module(sandbox: SandboxHandle) -> Iterator[None]:
    """tests/conftest.py's ``raised_quota`` (40 vCPU, 160 GiB, 3 RTX Pro 6000) for the whole module, whose promoted
    service is shared (module scope): the roles are under test, not the quota. The service is re-promoted zero-downtime
    (its candidate beside the serving L4 instance), which preflight refuses on a new project's 40 GiB
    (tests/e2e/test_new_project.py)."""
    before = sandbox.configure()
    raised = {"cpu_quota": 40, "memory_quota_gib": 160, "gpu_quota": {**before["gpu_quota"], "nvidia-rtx-pro-6000": 3}}
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: 15 minutes have passed
    with sandbox_settings(sandbox, **raised):
        yield


@pytest.fixture(scope="module")
def readme_roles(sandbox: SandboxHandle, flow_env, quota_raised_for_the_module: None) -> Iterator[SandboxHandle]:
    """The caller holds exactly the table's roles for the module; owner again afterwards."""
    with sandbox.caller_roles(README_ROLES):
        yield sandbox


@pytest.fixture(scope="module")
def doctored(readme_roles: SandboxHandle, build_source: Path) -> tuple[str, str, list[Check]]:
    """doctor's rows for the service and profile about to be promoted, before anything is created for them:
    (service, profile, rows)."""
    service = f"roles-{next(_ids)}"
    profile = save_profile(f"{service}-profile", build_source, service)
    try:
        rows = doctor(target="sandbox", profile=profile, service=service)
    except DoctorFailed as failed:
        rows = failed.checks  # the failed rows, for the test's message
    return service, profile, rows


@pytest.fixture(scope="module")
def promoted(doctored: tuple[str, str, list[Check]]) -> tuple[str, str]:
    """A service promoted twice (main, then dev) with only the table's roles, after doctor: (service, profile)."""
    service, profile, _ = doctored
    first = promote(service, profile)
    assert first.outcome == "promoted" and first.image is not None and first.image.attempts  # really built
    second = promote(service, profile, revision="dev")
    assert second.outcome == "promoted" and second.serving_revision != first.serving_revision
    return service, profile


def test_doctor_finds_nothing_failed_with_the_readme_roles_before_the_promote(
    doctored: tuple[str, str, list[Check]],
) -> None:
    _, _, rows = doctored
    assert [r for r in rows if r.status == "fail"] == []
    names = {r.name for r in rows}
    assert {"deployer permissions", "doctor permissions", "APIs enabled", "GPU quota", "build identity"} <= names
    assert "org policy gcp.resourceLocations" in names
    status = {r.name: r.status for r in rows}
    assert status["GPU quota"] == status["doctor permissions"] == status["APIs enabled"] == "ok", rows


def test_the_readme_roles_promote_scale_roll_back_and_tear_down(promoted: tuple[str, str]) -> None:
    service, _ = promoted
    assert scale_service(service=service, min_instances=1).changed
    assert scale_service(service=service, min_instances=0).changed
    back = rollback_model(service=service)
    assert back.to_revision != back.from_revision


@pytest.fixture
def without(readme_roles: SandboxHandle) -> Iterator[Callable[[str], None]]:
    """Drop one of the table's roles for the test; all of them again afterwards."""

    def drop(role: str) -> None:
        readme_roles.set_caller_roles([r for r in README_ROLES if r != role])

    try:
        yield drop
    finally:
        readme_roles.set_caller_roles(README_ROLES)


def _assert_names_the_grant(message: str, role: str) -> None:
    need = next(n for n in (*DEPLOYER_ROLES, *DOCTOR_ROLES) if n.role == role)
    named = re.search(r"missing permission ([A-Za-z0-9_.]+)", message)
    assert named, f"no permission named in: {message}"
    assert named.group(1) in need.permissions, f"{named.group(1)} is not one of {role}'s: {message}"
    assert f"grant {role}" in message and f"--role={role}" in message, message
    assert "gcloud projects add-iam-policy-binding" in message, message


# Which flow run first needs each role, on the already promoted service.
def _promote_again(service: str, profile: str, **_: object) -> None:
    promote(service, profile)


def _promote_with_a_new_service_account(service: str, profile: str, sandbox: SandboxHandle, **_: object) -> None:
    """Service Account User can read accounts; only creating (or deleting) one needs Service Account Admin."""
    fresh = GcpTarget.model_validate({**sandbox.target, "service_account_name": f"roles-sa-{next(_ids)}"})
    fresh.save("roles-fresh-account", overwrite=True)
    promote(service, profile, target="roles-fresh-account")


def _scale(service: str, **_: object) -> None:
    scale_service(service=service, min_instances=1)


def _promote_a_new_build(service: str, build_source: Path, **_: object) -> None:
    (build_source / "app.py").write_text(f"print('minimal roles {next(_ids)}')\n")  # a new tree: a new build
    promote(service, save_profile(f"{service}-rebuild", build_source, service))


def _promote_a_revision_that_crashes(service: str, build_source: Path, sandbox: SandboxHandle, **_: object) -> None:
    sandbox.run("POST", "/faults", json={"service": service, "faults": {"crash_at_start": "CUDA error: out of memory"}})
    promote(service, save_profile(f"{service}-crash", build_source, service, max_instances=2))


def _promote_a_new_revision(service: str, build_source: Path, **_: object) -> None:
    """A new revision is watched after it is verified: reading its metrics needs Monitoring Viewer, checked before
    traffic moves."""
    promote(service, save_profile(f"{service}-watched", build_source, service, max_instances=3))


def _promote_with_the_metrics_sidecar(service: str, build_source: Path, **_: object) -> None:
    """metrics: vllm: the serving account must hold roles/monitoring.metricWriter, which promote grants on the
    project (or an admin grants once)."""
    promote(service, save_profile(f"{service}-metrics", build_source, service, metrics="vllm"))


def _doctor(profile: str, **_: object) -> None:
    doctor(target="sandbox", profile=profile)


STEPS: dict[str, Callable[..., None]] = {
    "roles/run.admin": _scale,
    "roles/iam.serviceAccountUser": _promote_again,
    "roles/iam.serviceAccountAdmin": _promote_with_a_new_service_account,
    "roles/storage.admin": _promote_again,
    "roles/compute.networkAdmin": _promote_again,
    "roles/logging.viewer": _promote_a_revision_that_crashes,
    "roles/monitoring.viewer": _promote_a_new_revision,
    "roles/secretmanager.admin": _promote_again,
    "roles/artifactregistry.admin": _promote_again,
    "roles/cloudbuild.builds.editor": _promote_a_new_build,
    "roles/resourcemanager.projectIamAdmin": _promote_with_the_metrics_sidecar,
    "roles/serviceusage.serviceUsageViewer": _doctor,
    "roles/orgpolicy.policyViewer": _doctor,
}


def test_every_readme_role_has_a_removal_case() -> None:
    assert sorted(STEPS) == sorted(README_ROLES)


@pytest.mark.parametrize("role", README_ROLES)
def test_without_one_role_the_flow_names_the_permission_and_the_role(
    role: str, promoted: tuple[str, str], without, build_source: Path, readme_roles: SandboxHandle
) -> None:
    service, profile = promoted
    without(role)
    with pytest.raises(Exception) as caught:  # each step raises its own error type; the text is what matters
        STEPS[role](service=service, profile=profile, build_source=build_source, sandbox=readme_roles)
    _assert_names_the_grant(str(caught.value), role)


def test_doctor_without_the_policy_viewer_names_the_permission_and_the_role_on_the_org_policy_rows(
    promoted: tuple[str, str], without
) -> None:
    _, profile = promoted
    without("roles/orgpolicy.policyViewer")
    with pytest.raises(DoctorFailed) as caught:
        doctor(target="sandbox", profile=profile)
    rows = {r.name: r for r in caught.value.checks}
    policy_rows = [r for name, r in rows.items() if name.startswith("org policy ")]
    assert len(policy_rows) == 4, rows
    for row in policy_rows:
        assert "missing permission orgpolicy.policy.get; grant roles/orgpolicy.policyViewer" in row.detail, row
        assert row.fix.startswith("gcloud projects add-iam-policy-binding sandbox-project --member=")
        assert row.fix.endswith("--role=roles/orgpolicy.policyViewer")
    assert "roles/orgpolicy.policyViewer for orgpolicy.policy.get" in rows["doctor permissions"].detail
    assert "deployer permissions" not in rows and "APIs enabled" not in rows  # only what the role is for


def test_teardown_with_the_readme_roles(promoted: tuple[str, str], readme_roles: SandboxHandle) -> None:
    service, _ = promoted
    results = teardown(service=service)
    assert [(r.kind, r.action) for r in results] == [("service", "deleted")]
