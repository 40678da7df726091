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
    ),
}

VCPU_SECOND_USD = 0.000018
GIB_SECOND_USD = 0.000002
