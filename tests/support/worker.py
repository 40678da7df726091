"""A project set up for prefect-gcp's cloud-run-v2 worker against a sandbox, the way docs/production.md tells a team to.

1. The runner account (`gcloud iam service-accounts create pipeline-runner`) and a key of it
   (`gcloud iam service-accounts keys create`: IAM's keys.create, so its token_uri is the token endpoint the sandbox
   serves), with the deployer roles bootstrap prints the grant commands for.
2. `python -m flows.bootstrap gcp --pool-type cloud-run-v2 --build-worker-image --key-file KEY --endpoints FILE`,
   exactly as typed: blocks, the worker image built by Cloud Build, the pool's base job template, `prefect deploy`.
3. One sandbox-only step: the saved GcpTarget gets the sandbox's clock for Cloud Monitoring (its sampling period and
   visibility delay, 100x shorter than Google's), as `python -m sandbox blocks` gives every sandbox target; with
   Google's 60 s periods a promotion's watch would take ten real minutes.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from blocks.target import GcpTarget
from sandbox.handle import SandboxHandle
from tasks.common.permissions import DEPLOYER_ROLES
from tasks.infra import ensure
from tasks.report.work_pool import RUNNER_ACCOUNT_ID
from tests.support.prefect_server import run_command

TARGET_BLOCK = "sandbox"  # the name deployments/sandbox/*.yaml give as target
POOL = "hf-pipeline"


@dataclass(frozen=True)
class Pipeline:
    pool: str
    runner: str  # the runner account's email: the pool's jobs run as it, and its key is the credentials block
    key_file: Path
    roles: tuple[str, ...]  # what the runner was granted
    bootstrap_output: str


def runner_roles() -> tuple[str, ...]:
    """The deployer roles bootstrap prints grant commands for (docs/first-run.md, "Roles the deployer needs")."""
    return tuple(need.role for need in DEPLOYER_ROLES if not need.when.startswith("doctor"))


def make_key(sandbox: SandboxHandle, email: str, path: Path) -> Path:
    """`gcloud iam service-accounts keys create PATH --iam-account EMAIL`: the key file, from IAM's keys.create."""
    made = httpx.post(
        f"{sandbox.control_url}/v1/projects/{sandbox.info['target']['project']}/serviceAccounts/{email}/keys",
        json={},
        timeout=60,
    )
    made.raise_for_status()
    path.write_bytes(base64.b64decode(made.json()["privateKeyData"]))
    path.chmod(0o600)
    return path


def bootstrap_pipeline(sandbox: SandboxHandle, prefect: dict[str, str], folder: Path) -> Pipeline:
    owner_target = GcpTarget.model_validate(sandbox.target)  # the project owner's view, for the steps before
    runner = f"{RUNNER_ACCOUNT_ID}@{owner_target.project}.iam.gserviceaccount.com"
    ensure.get_or_create_service_account(owner_target, RUNNER_ACCOUNT_ID, runner, "Prefect flow runs", "worker e2e")
    key_file = make_key(sandbox, runner, folder / "pipeline-runner-key.json")
    roles = runner_roles()
    sandbox.set_caller_roles(list(roles), member=f"serviceAccount:{runner}")
    endpoints = folder / "endpoints.yaml"
    endpoints.write_text(yaml.safe_dump(sandbox.target["endpoints"]))
    env = {**prefect, "HF_TOKEN": sandbox.hub_token}
    done = run_command(
        [sys.executable, "-m", "flows.bootstrap", "gcp", "--project", owner_target.project, "--region",
         owner_target.region, "--name", TARGET_BLOCK, "--key-file", str(key_file), "--endpoints", str(endpoints),
         "--pool-type", "cloud-run-v2", "--build-worker-image"],
        env, timeout=1200,
    )  # fmt: skip
    run_command([sys.executable, "-c", _SANDBOX_CLOCK, json.dumps(sandbox.target)], prefect)
    return Pipeline(POOL, runner, key_file, roles, done.stdout)


# Run in a child with the Prefect server's settings (this process may point at another API).
_SANDBOX_CLOCK = f"""
import json, sys
from blocks.target import GcpTarget
target = GcpTarget.load({TARGET_BLOCK!r})
sandbox = json.loads(sys.argv[1])
for key in ("metrics_sample_seconds", "metrics_delay_seconds", "operation_poll_seconds"):
    setattr(target, key, sandbox[key])
target.save({TARGET_BLOCK!r}, overwrite=True)
"""


# What the worker tests print and wait for: a host running a worker, a Cloud Run job and a Prefect server may be busy.
def dump(value: object) -> str:
    return json.dumps(value, indent=1, default=str)[-6000:]


def wait_until(predicate, timeout: float, what: str, interval: float = 1.0):
    """Poll ``predicate`` until it returns something truthy; generous timeouts, the host may be busy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout} s")
