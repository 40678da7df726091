"""The prices the promotion report's cost is built from, each with where it was read and when.

One place for them, so a price that changes is changed once and the report can say where every figure comes from.
us-central1 (Cloud Run Tier 1), USD, list prices before free tiers and committed use discounts. Where Google publishes
no figure, the source says so and names the field report the figure comes from instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str
    """Where the figure was read: the pricing page and the date read, or a file when no page publishes one."""


CLOUD_RUN_PAGE = "https://cloud.google.com/run/pricing"
STORAGE_PAGE = "https://cloud.google.com/storage/pricing"
OBSERVABILITY_PAGE = "https://cloud.google.com/stackdriver/pricing"
GPU_PAGE = "https://cloud.google.com/run/docs/configuring/services/gpu"

# GPUs. Cloud Run bills a GPU per second for the instance's whole life, with instance-based billing only ("GPU support
# for services", Pricing impact). The L4 figures are its per-second SKUs times 3,600.
L4_GPU = Price(
    0.672,
    "GPU-hour",
    f"{CLOUD_RUN_PAGE}, us-central1, read 2026-08: NVIDIA L4 without zonal redundancy, $0.0001867 per GPU-second",
)
L4_GPU_ZONAL_REDUNDANCY = Price(
    1.047,
    "GPU-hour",
    f"{CLOUD_RUN_PAGE}, us-central1, read 2026-08: NVIDIA L4 with zonal redundancy, $0.0002909 per GPU-second",
)
RTX_PRO_6000_GPU = Price(
    2.20,
    "GPU-hour",
    f"no published Cloud Run price ({CLOUD_RUN_PAGE}, read 2026-08, lists none for the RTX PRO 6000); the field "
    "report seed 001_ff79a7059228a7e3.txt gives 'about $2.20 / hour' for it. Taken as the GPU's price alone, which "
    "overestimates rather than hides cost. It runs without zonal redundancy only (--no-gpu-zonal-redundancy).",
)

# Instance CPU and memory. Instance-based billing ("CPU always allocated"; every GPU service) and Cloud Run jobs share
# one row of the page; request-based billing costs more per second but only while requests are served.
CPU_INSTANCE_BASED = Price(
    0.000018,
    "vCPU-second",
    f"{CLOUD_RUN_PAGE}, Tier 1, read 2026-12: services with instance-based billing (CPU always allocated) and jobs, "
    "$0.00001800 / vCPU-second",
)
MEMORY_INSTANCE_BASED = Price(
    0.000002,
    "GiB-second",
    f"{CLOUD_RUN_PAGE}, Tier 1, read 2026-08: services with instance-based billing and jobs, $0.00000200 / GiB-second",
)
CPU_REQUEST_BASED = Price(
    0.000024,
    "vCPU-second",
    f"{CLOUD_RUN_PAGE}, Tier 1, read 2026-12: services with request-based billing (CPU only during requests), "
    "$0.00002400 / vCPU-second; requests cost $0.40 per million on top (not priced here)",
)
MEMORY_REQUEST_BASED = Price(
    0.0000025,
    "GiB-second",
    f"{CLOUD_RUN_PAGE}, Tier 1, request-based billing, $0.00000250 / GiB-second: read 2026-12 through a guide that "
    "quotes the page (cloudchipr.com, 'Google Cloud Run Pricing in 2025')",
)
# The flow's own runs: prefect-gcp's cloud-run-v2 worker runs each flow run as a Cloud Run job.
CPU_JOB = CPU_INSTANCE_BASED
MEMORY_JOB = MEMORY_INSTANCE_BASED

# The staged weights: Standard storage in the service's region (lesson 18). The page prices "per GB per month"; Cloud
# Storage's GB is 2^30 bytes (its pricing terms say so since 2014), so per GiB here.
STORAGE_STANDARD = Price(
    0.020,
    "GiB-month",
    f"{STORAGE_PAGE}, read 2026-12: Standard storage, Iowa (us-central1), $0.020 per GB per month",
)

# vLLM's metrics through the Managed Service for Prometheus sidecar (profile metrics: vllm): billed per sample.
PROMETHEUS_SAMPLES = Price(
    0.06,
    "million samples",
    f"{OBSERVABILITY_PAGE}, Cloud Monitoring pricing summary, read 2026-12 through a guide that quotes it (faun.dev, "
    "'Google Cloud Managed Service for Prometheus'): metrics ingested by Managed Service for Prometheus, $0.06 per "
    "million samples for the first 50 billion a month. The page's June 2023 archive read $0.15, before Google "
    "lowered it; check the live page.",
)

ALL: dict[str, Price] = {
    "L4_GPU": L4_GPU,
    "L4_GPU_ZONAL_REDUNDANCY": L4_GPU_ZONAL_REDUNDANCY,
    "RTX_PRO_6000_GPU": RTX_PRO_6000_GPU,
    "CPU_INSTANCE_BASED": CPU_INSTANCE_BASED,
    "MEMORY_INSTANCE_BASED": MEMORY_INSTANCE_BASED,
    "CPU_REQUEST_BASED": CPU_REQUEST_BASED,
    "MEMORY_REQUEST_BASED": MEMORY_REQUEST_BASED,
    "STORAGE_STANDARD": STORAGE_STANDARD,
    "PROMETHEUS_SAMPLES": PROMETHEUS_SAMPLES,
}


def gpu_hour(gpu_type: str, zonal_redundancy: bool) -> Price:
    """The price of one GPU-hour of ``gpu_type``; the RTX PRO 6000 has one figure (it runs without redundancy)."""
    if gpu_type == "nvidia-l4":
        return L4_GPU_ZONAL_REDUNDANCY if zonal_redundancy else L4_GPU
    if gpu_type == "nvidia-rtx-pro-6000":
        return RTX_PRO_6000_GPU
    raise ValueError(f"gpu_type '{gpu_type}': no price known; set the profile's gpu_hourly_usd")
