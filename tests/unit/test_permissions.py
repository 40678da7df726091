"""The deployer role table: docs/first-run.md matches the data, every role is Google's and holds what we say it does,
and a 403 from any API is turned into the permission and the role to grant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandbox.authz import roles as sandbox_roles
from tasks.common import permissions

FIRST_RUN = Path(__file__).resolve().parents[2] / "docs" / "first-run.md"  # "Roles the deployer needs"


def test_the_role_table_is_the_generated_one() -> None:
    text = FIRST_RUN.read_text()
    found = re.search(r"<!-- roles-table:start[^>]*-->\n(.*?)<!-- roles-table:end -->", text, re.S)
    assert found, "docs/first-run.md lost its roles table markers"
    assert found.group(1) == permissions.readme_table(), (
        "docs/first-run.md's 'Roles the deployer needs' table differs from tasks/common/permissions.py: "
        "paste readme_table()"
    )


def test_the_roles_doctor_reads_with_are_named() -> None:
    text = FIRST_RUN.read_text()
    assert all(f"`{need.role}`" in text for need in permissions.DOCTOR_ROLES)


@pytest.mark.parametrize("need", permissions.DEPLOYER_ROLES + permissions.DOCTOR_ROLES, ids=lambda n: n.role)
def test_each_role_holds_every_permission_we_rely_on(need: permissions.RoleNeed) -> None:
    """The sandbox's copy of Google's predefined roles agrees with the table (the test that proves the table
    against the sandbox would otherwise prove nothing)."""
    assert sandbox_roles.known(need.role)
    missing = [p for p in need.permissions if not sandbox_roles.grants(need.role, p)]
    assert not missing, f"{need.role} does not hold {missing}"


def test_no_role_is_redundant() -> None:
    """Every deployer role contributes a permission no other deployer role holds (else it could be dropped)."""
    for need in permissions.DEPLOYER_ROLES:
        others = [n.role for n in permissions.DEPLOYER_ROLES if n.role != need.role]
        unique = [p for p in need.permissions if not any(sandbox_roles.grants(r, p) for r in others)]
        assert unique, f"{need.role} adds nothing the other roles lack"


def test_required_permissions_narrow_with_the_profile() -> None:
    everything = permissions.required_permissions()
    assert "cloudbuild.builds.create" in everything and "secretmanager.versions.add" in everything
    plain = permissions.required_permissions(building=False, hub_token=False)
    assert "cloudbuild.builds.create" not in plain and "secretmanager.versions.add" not in plain
    assert permissions.ACT_AS in plain and plain == sorted(set(plain))


def test_doctor_permissions_are_their_own_set() -> None:
    """doctor's own reads are checked (and granted) apart from the deployer's: neither list holds the other's."""
    doctor = permissions.doctor_permissions()
    assert doctor == ["orgpolicy.policy.get", "serviceusage.quotas.get", "serviceusage.services.get"]
    assert not set(doctor) & set(permissions.required_permissions())
    assert all(need.when == permissions.DOCTOR for need in permissions.DOCTOR_ROLES)
    assert "| doctor (read-only checks) |" in permissions.readme_table()


@pytest.mark.parametrize(
    ("message", "permission", "role"),
    [
        (
            "Permission 'run.services.create' denied on resource 'projects/p/locations/l/services/s' "
            "(or resource may not exist).",
            "run.services.create",
            "roles/run.admin",
        ),
        (
            "Permission 'iam.serviceaccounts.actAs' denied on service account a@p.iam.gserviceaccount.com "
            "(or it may not exist).",
            "iam.serviceAccounts.actAs",
            "roles/iam.serviceAccountUser",
        ),
        (
            "me@example.com does not have storage.buckets.create access to the Google Cloud project. Permission "
            "'storage.buckets.create' denied on resource (or it may not exist).",
            "storage.buckets.create",
            "roles/storage.admin",
        ),
        (
            "Required 'compute.subnetworks.create' permission for 'projects/p/regions/r/subnetworks/s'",
            "compute.subnetworks.create",
            "roles/compute.networkAdmin",
        ),
        (
            "Permission 'secretmanager.versions.add' denied for resource 'projects/p/secrets/s' (or it may not exist).",
            "secretmanager.versions.add",
            "roles/secretmanager.admin",
        ),
        (
            "generic::permission_denied: caller does not have permission to act as service account "
            "projects/p/serviceAccounts/112288884898868582499.",
            "iam.serviceAccounts.actAs",
            "roles/iam.serviceAccountUser",
        ),
    ],
)
def test_google_403_messages_name_the_permission_and_role(message: str, permission: str, role: str) -> None:
    assert permissions.denied_permission(message) == permission
    explained = permissions.explain_denied(message, "acme-ml")
    assert f"missing permission {permission}" in explained
    assert "gcloud projects add-iam-policy-binding acme-ml --member=" in explained and f"--role={role}" in explained


def test_storage_names_the_caller_so_the_command_does_too() -> None:
    message = (
        "bot@acme.iam.gserviceaccount.com does not have storage.objects.list access to the Google Cloud Storage bucket."
    )
    assert "--member=serviceAccount:bot@acme.iam.gserviceaccount.com" in permissions.explain_denied(message, "acme")


def test_a_message_without_a_permission_is_left_to_the_caller() -> None:
    assert permissions.explain_denied("The caller does not have permission", "acme") is None
