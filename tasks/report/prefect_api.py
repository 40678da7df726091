"""The Cloud Run pool's side of reaching the Prefect API: Direct VPC egress for a private API, and the Prefect
credential as a Secret Manager reference (tasks/checks/api_reach.py says why each is needed).

Anyone with run.jobs.get reads a plain-text key from a job (PrefectHQ/prefect#18581, #11040). prefect-gcp 0.6.22's
``prefect_api_key_secret`` / ``prefect_api_auth_string_secret`` variables (PrefectHQ/prefect PR #18594) render a
``secretKeyRef`` instead and drop the plain value (``CloudRunWorkerJobV2Configuration._populate_env``);
``store_prefect_credentials`` puts the value in Secret Manager and lets the pool's job account read that secret only.
"""

from __future__ import annotations

from typing import Any

from prefect.settings import get_current_settings

from blocks.target import GcpTarget
from tasks.checks.api_reach import CREDENTIALS
from tasks.infra.access import grant_secret_accessor
from tasks.infra.ensure import ensure_secret, secret_path


def job_vpc_access(target: GcpTarget) -> dict[str, Any]:
    """Direct VPC egress for a job (run.v2 ``GoogleCloudRunV2VpcAccess``) on the target's network and subnet; only
    private ranges go through the VPC, so Google's APIs and the Hub stay on Cloud Run's own path."""
    return {
        "networkInterfaces": [{"network": target.network, "subnetwork": target.subnet}],
        "egress": "PRIVATE_RANGES_ONLY",
    }


def store_prefect_credentials(target: GcpTarget, job_account: str) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Each Prefect credential set here stored in Secret Manager (a version added only when it changed) with
    roles/secretmanager.secretAccessor for ``job_account`` on that secret only. Returns the pool variables that
    reference them (``{variable: {"secret": path, "version": "latest"}}``) and one line per credential, without
    its value."""
    api = get_current_settings().api
    variables: dict[str, dict[str, str]] = {}
    lines = []
    for variable, setting, secret_id, field in CREDENTIALS:
        value = getattr(api, field)
        if value is None or not value.get_secret_value():
            continue
        stored = ensure_secret(target, value, secret_id)
        granted = grant_secret_accessor(target, secret_id, email=job_account)
        name = secret_path(target, secret_id)
        # "latest": a rotated credential reaches the next job without touching the pool.
        variables[variable] = {"secret": name, "version": "latest"}
        action = "unchanged" if stored.action == "found" else stored.action
        access = "granted" if granted.action == "updated" else "already held"
        lines.append(f"secret {name} (from {setting}): {action}; secretAccessor for {job_account}: {access}")
    return variables, lines
