"""Set up Prefect for a project, once and again (idempotent): `python -m flows.bootstrap gcp --project P --region R`.

`gcp` registers the block types, saves the GcpTarget (Google's endpoints unless `--endpoints`), a prefect-gcp
GcpCredentials block (Application Default Credentials, or `--key-file`) and, when HF_TOKEN is set, the Hub token
as a Secret block; it creates the work pool the deployments use (`process`, or prefect-gcp's `cloud-run-v2` with
its base job template filled in, optionally with a worker image built by Cloud Build), deploys, and prints the
next command. `deploy` only redeploys (after a model file changed); on a cloud-run-v2 pool it first checks that the
pool's image holds this tree, and refuses a stale one or rebuilds it (`--build-worker-image`:
tasks/report/pool_image.py). A running sandbox's blocks come from
`python -m sandbox blocks DIR` instead of `gcp`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from google.auth.exceptions import DefaultCredentialsError
from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect_gcp import GcpCredentials

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.target import ApiEndpoints
from flows import schedule_control
from flows.common import DEFAULT_TARGET, load_target
from flows.project import PROJECT_DIR, pipeline_pool
from tasks.checks.api_reach import Reach, require_reachable_api
from tasks.common.permissions import DEPLOYER_ROLES, grant_command
from tasks.image.worker_image import rebuild_command
from tasks.infra.ensure import ensure_network, ensure_subnet, get_or_create_service_account
from tasks.report.pool_image import check_pool_image, pinned_image_warning, read_pool
from tasks.report.prefect_api import job_vpc_access, store_prefect_credentials
from tasks.report.work_pool import (
    DEFAULT_STAGING_MB_S,
    JobSize,
    build_worker_image,
    cloud_run_base_job_template,
    ensure_work_pool,
    job_size,
    runner_service_account,
)

POOL_TYPES = ("process", "cloud-run-v2")
TOKEN_BLOCK = "hf-token"
CREDENTIALS_BLOCK = "pipeline"


def register_block_types() -> None:
    """Our blocks and prefect-gcp's credentials in the UI's block catalogue."""
    for block in (GcpTarget, ServingProfile, ModelSource, GcpCredentials):
        block.register_type_and_schema()


def _values(data: Any) -> Any:
    # A dump carries the document's id and name (`_block_document_id`, ...): a new block has none yet.
    if isinstance(data, dict):
        return {key: _values(value) for key, value in data.items() if not key.startswith("_")}
    return [_values(item) for item in data] if isinstance(data, list) else data


def _comparable(block: Block) -> dict[str, Any]:
    """A block's values, secrets included, for telling "unchanged" from "updated" (never printed)."""
    dumped = block.model_dump(mode="json", context={"include_secrets": True})
    return _values(json.loads(json.dumps(dumped, default=str)))


def save_block(block: Block, name: str) -> str:
    """Save ``block`` as ``name``: "created", "updated", or "unchanged" when the saved one has the same values."""
    try:
        current = type(block).load(name, validate=False)
    except ValueError:
        current = None
    if current is not None and _comparable(current) == _comparable(block):
        block._block_document_id = current._block_document_id  # later saves nest it by reference
        return "unchanged"
    block.save(name, overwrite=True)
    return "created" if current is None else "updated"


def _endpoints(path: str | None) -> ApiEndpoints | None:
    if not path:
        return None
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--endpoints: {path} does not exist") from None
    return ApiEndpoints.model_validate(data)


def _credentials(key_file: str | None) -> GcpCredentials:
    """ADC when no key file (the identity `gcloud auth application-default login` or the worker's metadata
    server gives); a key file's contents otherwise, so a worker elsewhere has them (stored as a secret)."""
    if not key_file:
        try:
            return GcpCredentials()  # prefect-gcp looks the credentials up as it is made
        except DefaultCredentialsError:
            raise ValueError(
                "no Application Default Credentials on this machine: run `gcloud auth application-default login` "
                "(or run where a metadata server gives an identity), or give --key-file KEY.json"
            ) from None
    try:
        info = json.loads(Path(key_file).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise ValueError(f"--key-file: {key_file} is not a readable service account key file ({exc})") from None
    if info.get("type") != "service_account":
        raise ValueError(f"--key-file: {key_file} is not a service account key (type is {info.get('type')!r})")
    return GcpCredentials(service_account_info=info)


def ensure_pool(name: str, pool_type: str, target: GcpTarget, args: argparse.Namespace, reach: Reach = "public") -> str:
    """The deployments' work pool, created or repaired; a Cloud Run pool gets our job variables as defaults, the
    Prefect credential set here as a Secret Manager reference, and Direct VPC egress when the API (``reach``, from
    ``require_reachable_api``) is at a private address."""
    template = None
    if pool_type == "cloud-run-v2":
        image = args.worker_image
        if args.build_worker_image:
            image = build_worker_image(target, PROJECT_DIR)
            print(f"worker image: {image}")
        if not image:
            raise ValueError(
                "--pool-type cloud-run-v2: the pool's jobs need the image that holds this project; give "
                "--worker-image REF, or --build-worker-image to build ./Dockerfile with Cloud Build"
            )
        if not args.build_worker_image:
            warning = pinned_image_warning(name, image, PROJECT_DIR, target, rebuild_command(args.name))
            if warning:
                print(warning, file=sys.stderr)
        job_account = args.worker_service_account or runner_service_account(target)
        print(runner_account(target, job_account))
        secrets, lines = store_prefect_credentials(target, job_account)
        print("\n".join(lines or ["no PREFECT_API_KEY or PREFECT_API_AUTH_STRING: the jobs get no Prefect credential"]))
        vpc_access = None
        if reach == "private":  # the jobs reach the API through the target's VPC: make sure it exists, as promote does
            for result in (ensure_network(target), ensure_subnet(target)):
                print(f"{result.kind} {result.name}: {result.action} (Direct VPC egress to the private Prefect API)")
            vpc_access = job_vpc_access(target)
        size = pool_job_size(PROJECT_DIR / "deployments", args.staging_mb_s)
        # A key file's block is referenced, so each job gets it; with ADC the worker's own identity is the same
        # thing, and a reference to an ADC block is refused: the server checks the defaults with the block's secrets
        # obfuscated, and its empty service_account_info becomes '********' (422 on Prefect 3.9.1).
        template = cloud_run_base_job_template(
            target, image, service_account=args.worker_service_account,
            credentials_block=args.credentials_block if args.key_file else None, secrets=secrets, vpc_access=vpc_access,
            **({"cpu": str(size.cpu), "memory": size.memory, "timeout": size.timeout_s} if size else {}),
        )  # fmt: skip
    return ensure_work_pool(name, pool_type, template)


def model_weights(model_dir: Path) -> tuple[int, list[str]]:
    """The largest weights among the project's model files (``model_dir``/*.yaml), as the Hub lists them now (HF_TOKEN
    for gated ones), and one line per file; a file whose size cannot be read says why and is left out."""
    from flows.common import read_spec
    from flows.promote import hf_resolve_model
    from tasks.weights.hub_retry import HubRetryPolicy
    from tasks.weights.staging import StagingOptions

    options = StagingOptions(retry=HubRetryPolicy(max_attempts=2, budget_s=30))  # a setup step: no long waits
    largest, lines = 0, []
    for path in sorted(model_dir.glob("*.yaml")):
        try:
            spec = read_spec(str(path), within=model_dir)
            source = ModelSource(
                repo_id=spec["model"], revision=spec.get("revision", "main"), hub_endpoint=spec.get("hub_endpoint"),
                allow_patterns=spec.get("allow_patterns"), ignore_patterns=spec.get("ignore_patterns"),
            )  # fmt: skip
            _, weights, _ = hf_resolve_model.fn(source, None, options)
        except Exception as exc:  # sizing is advice: any failure leaves this file out, saying why
            lines.append(f"  {path.name}: size unknown ({str(exc).splitlines()[0][:200]})")
            continue
        lines.append(f"  {path.name}: {source.repo_id}@{source.revision}, {weights / 1e6:,.1f} MB of weights")
        largest = max(largest, weights)
    return largest, lines


def pool_job_size(model_dir: Path, staging_mb_s: float) -> JobSize | None:
    """The Cloud Run pool's job size for the largest model the project stages (tasks/report/work_pool.py ``job_size``);
    None, keeping the defaults, when no model file's size could be read."""
    largest, lines = model_weights(model_dir)
    print("model files (the pool's jobs are sized for the largest):")
    print("\n".join(lines) or "  none")
    if not largest:
        print("  no size known: the pool keeps its default job size (2 vCPU, 4Gi, 10800 s)")
        return None
    size = job_size(largest, staging_mb_s)
    print(f"  jobs: {size.describe()}")
    return size


def runner_account(target: GcpTarget, email: str) -> str:
    """The identity the pool's jobs run as: made when it belongs to the project and is missing, and the roles it
    needs, as the commands that grant them (granting project roles is the project owner's call, not ours)."""
    lines = []
    if email.endswith(f"@{target.project}.iam.gserviceaccount.com"):
        result = get_or_create_service_account(
            target, email.split("@")[0], email, display_name="Prefect flow runs (hf-cloudrun-pipeline)",
            description="Runs the pipeline's flows as Cloud Run jobs of its Prefect work pool",
        )  # fmt: skip
        lines.append(f"service account {email}: {result.action}")
    lines.append(f"the pool's jobs run as {email}; it needs the deployer roles (docs/first-run.md, the role table):")
    member = f"serviceAccount:{email}"
    lines += [f"  {grant_command(target.project, need.role, member)}" for need in DEPLOYER_ROLES
              if not need.when.startswith("doctor")]  # fmt: skip
    return "\n".join(lines)


def deploy(prefect_file: Path) -> list[str]:
    """`prefect --no-prompt deploy --all` for ``prefect_file``, then its model schedules settled
    (flows/schedule_control.py): paused while the GcpTarget their deployment names is missing, resumed once it exists
    when bootstrap paused them, otherwise left as their operator set them. One line per scheduled deployment."""
    with get_client(sync_client=True) as client:
        before = schedule_control.schedule_slugs(client, prefect_file)
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)],
        cwd=PROJECT_DIR, capture_output=True, text=True, env={**os.environ, "PREFECT_CLI_COLORS": "false"},
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"prefect deploy failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    with get_client(sync_client=True) as client:
        return schedule_control.settle(client, prefect_file, before)


def _gcp(args: argparse.Namespace) -> int:
    prefect_file = PROJECT_DIR / "prefect.yaml"
    reach = require_reachable_api(args.pool_type)  # before any write: a pool whose jobs cannot reach the API is no use
    register_block_types()
    credentials = _credentials(args.key_file)
    print(f"GcpCredentials '{args.credentials_block}': {save_block(credentials, args.credentials_block)}")
    target = GcpTarget(
        project=args.project, region=args.region, invokers=args.invoker, endpoints=_endpoints(args.endpoints),
        gcp_credentials=credentials,
    )  # fmt: skip
    print(f"GcpTarget '{args.name}' ({target.project}/{target.region}): {save_block(target, args.name)}")
    if os.environ.get("HF_TOKEN"):
        action = save_block(Secret(value=os.environ["HF_TOKEN"]), TOKEN_BLOCK)
        print(f"Secret '{TOKEN_BLOCK}' (from HF_TOKEN): {action}")
    else:
        print(f"no HF_TOKEN: gated models need a token; save one with `prefect block create secret` as '{TOKEN_BLOCK}'")
    pool = pipeline_pool(prefect_file)
    print(f"work pool '{pool}' ({args.pool_type}): {ensure_pool(pool, args.pool_type, target, args, reach)}")
    if args.no_deploy:
        return 0
    for line in deploy(prefect_file):
        print(f"schedule {line}")
    print("\nnext:")
    print(f"  prefect deployment run promote-model/promote -p model=google/gemma-4-E2B-it -p target={args.name} "
          f"-p token_secret_block={TOKEN_BLOCK}")  # fmt: skip
    if args.pool_type == "process":
        print(f"  prefect worker start --pool {pool}")
    else:
        print(
            f"  prefect worker start --pool {pool} --type cloud-run-v2   (anywhere; each run becomes a Cloud Run job)"
        )
    return 0


def _deploy_target(name: str) -> GcpTarget:
    try:
        return load_target(name)
    except ValueError:
        raise ValueError(
            f"--name: no GcpTarget block named '{name}' to reach Artifact Registry and Cloud Build with, for the work "
            "pool's worker image; give --name with the block `bootstrap gcp` saved (its --name)"
        ) from None


def _deploy(args: argparse.Namespace) -> int:
    prefect_file = (PROJECT_DIR / args.prefect_file).resolve()
    pool = pipeline_pool(prefect_file)
    found = read_pool(pool)
    if found is None:
        print(f"work pool '{pool}' (process): {ensure_work_pool(pool, 'process', None)}")
    else:
        # Before `prefect deploy`: a cloud-run-v2 pool's runs read the model files from its image (flows/project.py).
        fix = rebuild_command(args.name)
        lines = check_pool_image(found, PROJECT_DIR, lambda: _deploy_target(args.name), args.build_worker_image, fix)
        for line in lines:
            print(line, file=sys.stderr if line.startswith("warning: ") else sys.stdout)
    for line in deploy(prefect_file):
        print(f"schedule {line}")
    print(f"\nnext: prefect worker start --pool {pool}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.bootstrap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="kind", required=True)
    gcp = sub.add_parser("gcp", help="blocks, work pool and deployments for a real project")
    gcp.add_argument("--project", required=True)
    gcp.add_argument("--region", required=True)
    gcp.add_argument("--name", default=DEFAULT_TARGET, help="GcpTarget block name (default: %(default)s)")
    gcp.add_argument("--invoker", action="append", default=[], help="principal allowed to call services")
    gcp.add_argument("--key-file", help="service account key file; default: Application Default Credentials")
    gcp.add_argument("--credentials-block", default=CREDENTIALS_BLOCK, help="GcpCredentials block name")
    gcp.add_argument("--endpoints", help="YAML/JSON file of API base URLs (Private Service Connect, an emulator)")
    gcp.add_argument("--pool-type", choices=POOL_TYPES, default="process", help="work pool type (default: process)")
    gcp.add_argument("--worker-image", help="cloud-run-v2: the image that holds this project")
    gcp.add_argument("--build-worker-image", action="store_true", help="cloud-run-v2: build ./Dockerfile first")
    gcp.add_argument("--worker-service-account", help="cloud-run-v2: the identity flow runs have")
    gcp.add_argument(
        "--staging-mb-s", type=float, default=DEFAULT_STAGING_MB_S,
        help="cloud-run-v2: the Hub-to-bucket rate the jobs' timeout plans for (default: %(default)s MB/s)",
    )  # fmt: skip
    gcp.add_argument("--no-deploy", action="store_true", help="stop before `prefect deploy`")
    redeploy = sub.add_parser("deploy", help="deploy a prefect file; each schedule keeps its state")
    redeploy.add_argument("--prefect-file", default="prefect.yaml", help="relative to the project folder")
    redeploy.add_argument("--name", default=DEFAULT_TARGET,
                          help="cloud-run-v2: the GcpTarget block the worker image is read and built with")  # fmt: skip
    redeploy.add_argument("--build-worker-image", action="store_true",
                          help="cloud-run-v2: build ./Dockerfile if the pool's image lacks this tree")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        return _gcp(args) if args.kind == "gcp" else _deploy(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
