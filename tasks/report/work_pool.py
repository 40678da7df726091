"""The Prefect side of a project: the work pool our deployments run on, and the image its Cloud Run jobs run.

- ``cloud_run_base_job_template``: prefect-gcp's own base job template for its ``cloud-run-v2`` worker, with the
  variable defaults filled from the target (image, region, credentials block, the pipeline's runner account,
  cpu, memory, timeout), so deployments on the pool need no job variables of their own.
- ``ensure_work_pool``: get-or-create the pool; a drifted base job template is put back, a pool of another type
  is refused with the fix.
- ``build_worker_image``: this project's ./Dockerfile built by Cloud Build with our build code (content tag,
  skip-if-built, the dedicated build identity), in one attempt on a small machine: nothing is compiled.
- ``job_size``: the pool's job CPU and timeout for the largest model its deployments stage, from the staging bench's
  CPU per GiB and a stated network rate.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker
from prefect_gcp.workers.cloud_run_v2 import CloudRunWorkerV2, CloudRunWorkerV2Variables
from pydantic import TypeAdapter, ValidationError

from blocks.target import GcpTarget
from tasks.checks import act_as
from tasks.common.logs import run_logger
from tasks.image.builds import build_image, find_built, source_digest
from tasks.image.images import content_tag
from tasks.image.worker_image import worker_image_build
from tasks.infra import build_identity, ensure

PoolType = Literal["process", "cloud-run-v2"]
PoolAction = Literal["created", "unchanged", "updated"]
# The identity flow runs on the Cloud Run pool run as (bootstrap creates it when missing); GcpTarget
# names only the serving and build accounts.
RUNNER_ACCOUNT_ID = "pipeline-runner"
CREDENTIALS_BLOCK_TYPE = "gcp-credentials"


# Job sizing --------------------------------------------------------------------------------------------------------
# The stager's own CPU per GiB, from `python -m bench.staging` (docs/development.md, "Staging": medians 2.20, 1.95
# and 1.80 CPU-s per GiB at 1, 4 and 16 GiB; the highest is taken). The bench runs on plain HTTP: HTTPS to the Hub
# and to Cloud Storage costs more CPU, so the figure is doubled.
STAGING_CPU_S_PER_GIB = 2.2 * 2
# What the network gives a job is not published (Cloud Run documents no per-instance bandwidth: bench/README.md), so
# it is a stated assumption, overridable with `bootstrap gcp --staging-mb-s`.
DEFAULT_STAGING_MB_S = 100.0
# Everything in a promotion but the staging, with room: preflight and resolve, the image (pinned; a build runs in
# Cloud Build, not in the job, but is waited for: up to its own timeout), the deploy with a GPU revision's startup
# probe window (up to 1,800 s for GPU services), verification, and the watch (10 periods of 60 s plus 180 s of
# visibility delay per traffic step, a canary adding steps).
PROMOTION_BUDGET_S = 3 * 3600
STAGING_MARGIN = 1.5  # a Hub that slows down (429s with Retry-After, seed 001) without the job being stopped
JOB_CPUS = (2, 4, 8)
# Cloud Run's minimum memory per CPU ("Configure memory limits": more than 4 CPU needs at least 4 GiB); the stager's
# peak RSS stays near 210 MiB whatever the model's size (the staging bench), so memory never grows with the model.
JOB_MEMORY = "4Gi"
GIB = 1024**3


@dataclass(frozen=True)
class JobSize:
    """The pool's job resources for staging ``weights_bytes``, and the figures they come from."""

    cpu: int
    memory: str
    timeout_s: int
    weights_bytes: int
    staging_mb_s: float  # the rate the staging is planned at: the CPU bound or the network, whichever binds
    staging_s: float

    def describe(self) -> str:
        return (
            f"{self.weights_bytes / 1e9:.1f} GB staged at {self.staging_mb_s:.0f} MB/s in about "
            f"{self.staging_s / 60:.0f} min: {self.cpu} vCPU, {self.memory}, timeout {self.timeout_s} s"
        )


def job_size(weights_bytes: int, network_mb_s: float = DEFAULT_STAGING_MB_S) -> JobSize:
    """The smallest job (vCPU) whose CPU-bound staging rate is not below the network's, and a timeout that holds the
    whole promotion: the staging at the binding rate with a margin, plus ``PROMOTION_BUDGET_S``."""
    if network_mb_s <= 0:
        raise ValueError(f"staging rate {network_mb_s} MB/s: give a positive rate")

    def cpu_bound_mb_s(cpus: int) -> float:
        return cpus / STAGING_CPU_S_PER_GIB * GIB / 1e6

    cpus = next((c for c in JOB_CPUS if cpu_bound_mb_s(c) >= network_mb_s), JOB_CPUS[-1])
    rate = min(cpu_bound_mb_s(cpus), network_mb_s)
    staging_s = weights_bytes / 1e6 / rate
    timeout = PROMOTION_BUDGET_S + math.ceil(staging_s * STAGING_MARGIN / 60) * 60
    return JobSize(cpus, JOB_MEMORY, timeout, weights_bytes, rate, staging_s)


class WorkPoolError(RuntimeError):
    """A work pool that cannot be made what the project needs without the user choosing something else."""


# Base job template ----------------------------------------------------------------------------------------------
def runner_service_account(target: GcpTarget) -> str:
    """The pipeline runner's service account email in the target's project."""
    return f"{RUNNER_ACCOUNT_ID}@{target.project}.iam.gserviceaccount.com"


def block_reference(block_document_id: str) -> dict[str, Any]:
    """How a work pool variable's default names a block document: Prefect resolves ``{"$ref": {"block_document_id":
    ID}}`` to the block's data when a worker builds a job (prefect/utilities/templating ``resolve_block_document_
    references``); Prefect's own Cloud Run provisioner stores credentials that way
    (prefect/infrastructure/provisioners/cloud_run.py)."""
    return {"$ref": {"block_document_id": block_document_id}}


def credentials_block_id(name: str) -> str:
    """The id of the GcpCredentials block document ``name``; WorkPoolError naming how to save it when missing."""
    with get_client(sync_client=True) as client:
        try:
            document = client.read_block_document_by_name(name, CREDENTIALS_BLOCK_TYPE, include_secrets=False)
        except ObjectNotFound:
            raise WorkPoolError(
                f"no {CREDENTIALS_BLOCK_TYPE} block named '{name}' for the Cloud Run pool's jobs: save one first "
                f"(the bootstrap command does, from ADC or a key file), or leave credentials out to let the worker "
                "use its own Application Default Credentials"
            ) from None
    return str(document.id)


def check_variables(values: dict[str, Any]) -> None:
    """Check values against prefect-gcp's variables model, the source of the pool's variables schema (memory
    pattern, timeout bounds), field by field: the whole model would build a GcpCredentials, which wants ADC."""
    for key, value in values.items():
        field = CloudRunWorkerV2Variables.model_fields[key]
        try:
            TypeAdapter(Annotated[field.annotation, field]).validate_python(value)
        except ValidationError as exc:
            raise ValueError(f"{key} {value!r}: {exc.errors()[0]['msg']} (the Cloud Run pool's variables)") from None


def cloud_run_base_job_template(
    target: GcpTarget,
    image: str,
    service_account: str | None = None,
    credentials_block: str | None = "pipeline",
    cpu: str = "2",
    memory: str = "4Gi",
    timeout: int = 10800,
    secrets: dict[str, dict[str, str]] | None = None,
    vpc_access: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """prefect-gcp's default ``cloud-run-v2`` base job template with our values as the variables' defaults.

    ``credentials_block`` names a saved GcpCredentials block (resolved to its document id through the Prefect
    API); None leaves credentials unset (the worker's ADC). ``service_account`` defaults to the pipeline runner
    account of the target's project. ``secrets``: secret variables' defaults (``prefect_api_key_secret``: a
    SecretKeySelector, tasks/report/prefect_api.py). ``vpc_access``: the job body's run.v2 VpcAccess (Direct VPC
    egress to a private Prefect API). Values are checked against prefect-gcp's variables model first, so a bad
    memory string fails here rather than when the first flow run is submitted.
    """
    values: dict[str, Any] = {
        "image": image,
        "region": target.region,
        "service_account_name": service_account or runner_service_account(target),
        "cpu": cpu,
        "memory": memory,
        "timeout": timeout,
        **(secrets or {}),
    }
    check_variables(values)
    if credentials_block is not None:
        values["credentials"] = block_reference(credentials_block_id(credentials_block))
    template = CloudRunWorkerV2.get_default_base_job_template()
    properties = template["variables"]["properties"]
    for key, value in values.items():
        properties[key]["default"] = value
    if vpc_access is not None:
        # prefect-gcp's only VPC variable is vpc_connector_name (a Serverless VPC Access connector). Its job body keeps
        # a vpcAccess that is more than an unset connector (``_remove_vpc_access_if_unset``): this reaches jobs.create.
        template["job_configuration"]["job_body"]["template"]["template"]["vpcAccess"] = vpc_access
    return template


def default_base_job_template(pool_type: PoolType) -> dict[str, Any]:
    """What ``prefect work-pool create --type TYPE`` stores: the worker's own default template."""
    worker = ProcessWorker if pool_type == "process" else CloudRunWorkerV2
    return worker.get_default_base_job_template()


# Work pool ------------------------------------------------------------------------------------------------------
def ensure_work_pool(name: str, pool_type: PoolType, base_job_template: dict[str, Any] | None = None) -> PoolAction:
    """Get or create the work pool ``name`` of ``pool_type`` with ``base_job_template`` (the worker's default when
    None). A pool of that type whose template differs is updated; one of another type is refused (its deployments
    and workers expect that type), naming the fix. Returns "created", "unchanged" or "updated"."""
    wanted = copy.deepcopy(base_job_template) if base_job_template is not None else default_base_job_template(pool_type)
    log = run_logger()
    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, base_job_template=wanted))
            log.info("work pool %s (%s): created", name, pool_type)
            return "created"
        if existing.type != pool_type:
            raise WorkPoolError(
                f"work pool '{name}' exists with type '{existing.type}', not '{pool_type}': choose another pool name "
                f"(--pool NAME), or delete that pool first (`prefect work-pool delete {name}`) if nothing uses it"
            )
        if existing.base_job_template == wanted:
            log.info("work pool %s (%s): unchanged", name, pool_type)
            return "unchanged"
        client.update_work_pool(name, WorkPoolUpdate(base_job_template=wanted))
        log.info("work pool %s (%s): base job template updated (it had drifted)", name, pool_type)
        return "updated"


# Worker image ---------------------------------------------------------------------------------------------------
def build_worker_image(target: GcpTarget, project_dir: Path) -> str:
    """The worker image's reference (by digest) in the target's Artifact Registry, built from ``project_dir`` with
    Cloud Build unless an image with the same content tag is already there (then nothing else is called).

    Before building it makes what a build needs, as promote-model's ensure-infrastructure step does when a profile
    builds: the repository, the build bucket, the build identity with its grants there, and the caller's actAs on
    it. The model bucket is left alone: revoking an earlier version's grants there is promote's cleanup, and
    bootstrap may run before that bucket exists.
    """
    log = run_logger()
    build = worker_image_build(project_dir)
    existing = find_built(target, build, content_tag(build, source_digest(build)))
    if existing is not None:
        log.info("worker image already built from this source: %s", existing)
        return existing
    steps = (
        ensure.ensure_artifact_registry,
        ensure.ensure_build_bucket,
        build_identity.ensure_build_service_account,
        build_identity.grant_build_bucket_access,
        build_identity.grant_build_repository_writer,
    )
    for step in steps:
        result = step(target)
        log.info("%s %s: %s", result.kind, result.name, result.action)
    act_as.require_act_as(target, target.build_service_account_email, "building the worker image as the build identity")
    return build_image(target, build).image
