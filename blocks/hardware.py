"""Cloud Run GPU facts the product plans with (FACTS.md, Cloud Run paragraph; seed 001 for prices)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GpuTypeName = Literal["nvidia-l4", "nvidia-rtx-pro-6000"]
LaunchStage = Literal["GA", "BETA"]

MODEL_GARDEN_VLLM_IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:gemma4"
"""Google's Model Garden vLLM build, pinned by the tag seed 000 deployed; runs on the L4's CUDA 12.2 driver."""


@dataclass(frozen=True)
class GpuSpec:
    memory_gb: int
    min_cpu: int
    min_memory_gib: int
    driver_cuda: str
    regions: frozenset[str]
    hourly_usd: float
    """GPU price per hour without zonal redundancy (us-central1, 2026-08)."""
    compute_capability: tuple[int, int]
    """CUDA compute capability (NVIDIA's CUDA GPUs list: L4 8.9, RTX PRO 6000 Blackwell 12.0); vLLM checks dtypes and
    quantization kernels against it (tasks/checks/vllm_rules.py)."""
    default_quota: int
    """GPUs of this type a new project may use per region without zonal redundancy (with it, none): the figure assumed
    only when Service Usage cannot be read and the profile states no ``gpu_quota`` (tasks/checks/quotas.gpu_need)."""
    per_instance: int = 1
    """GPUs one Cloud Run instance gets: exactly one (FACTS.md), so vLLM parallelism cannot exceed 1."""
    launch_stage: LaunchStage = "GA"
    """Cloud Run launch stage of this GPU type: a preview (BETA) GPU needs the Service's ``launch_stage`` set to
    BETA, which is what ``gcloud beta run deploy`` does; without it Cloud Run refuses the deploy with 400 "The
    feature ... is not supported in the declared launch stage"."""
    container_cpus: tuple[int, ...] = (4, 6, 8)
    """Whole vCPUs the container holding the GPU may have (CONTAINER_SIZES below)."""
    max_instance_cpu: int | None = 8
    """vCPUs of all the instance's containers together; None: no published limit beyond each container's."""


GPUS: dict[str, GpuSpec] = {
    "nvidia-l4": GpuSpec(
        memory_gb=24,
        min_cpu=4,
        min_memory_gib=16,
        driver_cuda="12.2",
        regions=frozenset(
            {"asia-southeast1", "asia-south1", "europe-west1", "europe-west4", "us-central1", "us-east4"}
        ),
        hourly_usd=0.672,
        compute_capability=(8, 9),
        default_quota=3,  # FACTS.md: 3 for a first L4 deploy (lesson 6)
    ),
    "nvidia-rtx-pro-6000": GpuSpec(
        memory_gb=96,
        min_cpu=20,
        min_memory_gib=80,
        driver_cuda="13.0",
        regions=frozenset({"asia-southeast1", "asia-south2", "europe-west4", "us-central1"}),
        # No published Cloud Run price found (FACTS.md); seed 001's "about $2.20/h" taken as the GPU's price,
        # which overestimates rather than hides cost.
        hourly_usd=2.20,
        compute_capability=(12, 0),
        default_quota=1,  # seed 001: "RTX quota is often 1" (Service Usage says 1000: milli-GPUs, tasks/checks/quotas)
        # Preview on Cloud Run ("GPU support for services": "Preview — NVIDIA RTX PRO 6000 Blackwell GPU"); seed 004
        # deploys it with `gcloud beta run deploy`. L4 has been GA since 2025-04-07 (Cloud Run release notes).
        launch_stage="BETA",
        container_cpus=(20, 22, 24, 26, 28, 30),
        max_instance_cpu=None,
    ),
}

# Cloud Run sizes each container of an instance on its own; the instance is their sum.
# - vCPU: 0.08-1, or exactly 1, 2, 4, 6 or 8 ("Invalid value specified for container cpu. Must be equal to one of
#   [.08-1], 1.0, 2.0, 4.0, 6.0, 8.0", gcloud's refusal of 1.5 quoted in theredstring/redstring
#   deployment/CLOUD_RUN_CPU_VALUES.md; Cloud Run docs "Configure CPU limits for services": "Values greater than 1 must
#   be integer values" and the table lists 1, 2, 4, 6, 8). So 3, 5 and 7 are refused.
# - memory per vCPU ("Configure memory limits", required memory per CPU): 1 vCPU up to 4 GiB, 2 up to 8, 4 from 2 to
#   16, 6 from 4 to 24, 8 from 4 to 32; at least 512 MiB in the second generation environment GPUs need
#   ("Invalid value specified for container memory. For 8.0 CPU, memory must be between 4Gi and 32Gi inclusive.").
# - the GPU belongs to one container ("the GPU can only be attached to one container", "GPU support for services"),
#   and that container keeps the GPU's minimums: L4 4 vCPU / 16 GiB ("CPU must be at least 4; memory must be at least
#   16Gi"), RTX PRO 6000 20-30 vCPU in steps of 2 with 80 GiB up to 4 GiB per vCPU ("Must be equal to one of 20.0,
#   22.0", "memory must be between 80Gi"): the rule table of justinswe/rules_cloudrun (internal/manifest/
#   validation.go@7bec807), whose conformance test checks each refusal against Cloud Run's own validateOnly answer.
#   A sidecar beside vLLM cannot borrow from it: an instance of 20 vCPU for an RTX and a sidecar leaves vLLM 19.
# - all containers together: "Invalid value specified for cpu. Total millicpu may not exceed 8000." (an L4 service
#   of 8 vCPU plus a sidecar, gperdrizet/llm_detector notes/03-cloud_run_deployment.md@065f8ef; its 4 vCPU / 16 GiB
#   GPU container beside a 1 vCPU sidecar, 5 vCPU in all, deployed). No total is published for the RTX PRO 6000.
CONTAINER_SIZES: dict[int, tuple[int, int]] = {  # whole vCPUs: (least, most) MiB
    1: (512, 4 * 1024),
    2: (512, 8 * 1024),
    4: (2 * 1024, 16 * 1024),
    6: (4 * 1024, 24 * 1024),
    8: (4 * 1024, 32 * 1024),
}
MAX_INSTANCE_CPU = 8


def container_cpus(gpu_type: str | None) -> tuple[int, ...]:
    """The whole vCPUs a container may have: the GPU's container those its GPU allows, any other the table's."""
    return GPUS[gpu_type].container_cpus if gpu_type else tuple(CONTAINER_SIZES)


def memory_range_mib(cpu: int, gpu_type: str | None) -> tuple[int, int] | None:
    """The least and most MiB a container of ``cpu`` whole vCPUs may have (``gpu_type``: the container holding that
    GPU); None when Cloud Run takes no such vCPU count for it."""
    if cpu not in container_cpus(gpu_type):
        return None
    least, most = CONTAINER_SIZES.get(cpu, (0, cpu * 4 * 1024))
    if gpu_type:
        least = max(least, GPUS[gpu_type].min_memory_gib * 1024)
    return least, most


def instance_cpu_limit(gpu_type: str | None) -> int | None:
    """The most vCPUs an instance's containers may have together (None: no published limit)."""
    return GPUS[gpu_type].max_instance_cpu if gpu_type else MAX_INSTANCE_CPU


def size_problem(cpu: int, memory_mib: int, gpu_type: str | None) -> str | None:
    """Why Cloud Run refuses a container of ``cpu`` vCPUs and ``memory_mib`` (None: it takes it), in our words."""
    bounds = memory_range_mib(cpu, gpu_type)
    holder = f"the container holding the {gpu_type}" if gpu_type else "a container"
    if bounds is None:
        allowed = ", ".join(str(c) for c in container_cpus(gpu_type))
        return f"{holder} may have {allowed} vCPU, not {cpu}"
    if not bounds[0] <= memory_mib <= bounds[1]:
        least, most, memory = (x / 1024 for x in (*bounds, memory_mib))
        return f"{holder} with {cpu} vCPU may have {least:g} to {most:g} GiB, not {memory:g}"
    return None


VCPU_SECOND_USD = 0.000018
GIB_SECOND_USD = 0.000002
