"""Which Google services the sandbox project knows, their titles, and the Cloud Run GPU quota metrics.

Service names and titles come from the discovery documents the sandbox serves (``rootUrl`` host and ``title``:
run.v2 is "Cloud Run Admin API" at run.googleapis.com), so the SERVICE_DISABLED message names a service the way
Google's front end does.
"""

from __future__ import annotations

import functools
from urllib.parse import urlparse

from sandbox import discovery

# Enabled on every new project besides the APIs the sandbox serves (gcloud services list on a fresh project).
DEFAULT_SERVICES: dict[str, str] = {
    "bigquery.googleapis.com": "BigQuery API",
    "cloudapis.googleapis.com": "Google Cloud APIs",
    "monitoring.googleapis.com": "Cloud Monitoring API",
    "servicemanagement.googleapis.com": "Service Management API",
    "storage-api.googleapis.com": "Google Cloud Storage JSON API",
}


def service_of(api: str) -> str:
    """The service name of a discovery API id: "run.v2" -> "run.googleapis.com" (its ``rootUrl`` host)."""
    return _services_by_api()[api][0]


def title_of(service: str) -> str:
    """The service's title ("Cloud Run Admin API"), or the service name when the sandbox does not know it."""
    return known_services().get(service, service)


@functools.cache
def _services_by_api() -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for api in discovery.SERVED_APIS:
        doc = discovery.document(api)
        found[api] = (urlparse(doc["rootUrl"]).hostname or api, doc.get("title", api))
    return found


@functools.cache
def known_services() -> dict[str, str]:
    """Every service the sandbox project has, enabled unless configured otherwise: name -> title."""
    return {**DEFAULT_SERVICES, **dict(_services_by_api().values())}


# Cloud Run's regional quotas, as Service Usage (v1beta1 consumerQuotaMetrics) and the Cloud Quotas console list
# them. GPUs: "Total Nvidia L4 GPU allocation without zonal redundancy, per project per region"
# (run.googleapis.com/nvidia_l4_gpu_allocation_no_zonal_redundancy; Cloud Run docs "GPU support for services",
# https://cloud.google.com/run/docs/configuring/services/gpu, and "GPU zonal redundancy"), in whole GPUs; the RTX
# Pro 6000's in milli-GPUs: "Total Nvidia RTX Pro 6000 GPU allocation, in milli GPU, without zonal redundancy, per
# project per region" (Google's tutorial "Run LLM inference on GPUs with Gemma 4 and Ollama"; a write-up of the RTX
# codelab read 1000 from the quota API where the deploy said "allowed: 1"). vCPU and memory: "About maximum
# instances" links run.googleapis.com/cpu_allocation and run.googleapis.com/mem_allocation; the console names them
# "Total CPU allocation, in milli vCPU, per project per region" and "Total memory allocation, in bytes, per project
# per region" (googlecodelabs/feedback#1856: "CpuAllocPerProjectRegion requested: 60000 allowed: 20000"). The limit
# unit of the vCPU and memory metrics is unconfirmed (no public dump found): the GPU metrics' is used.
GPU_METRIC_PREFIX = "run.googleapis.com/"
QUOTA_UNIT = "1/{project}/{region}"
MILLI_GPU_TYPES = {"nvidia-rtx-pro-6000"}
CPU_METRIC = "run.googleapis.com/cpu_allocation"
CPU_DISPLAY_NAME = "Total CPU allocation, in milli vCPU, per project per region"
MEMORY_METRIC = "run.googleapis.com/mem_allocation"
MEMORY_DISPLAY_NAME = "Total memory allocation, in bytes, per project per region"


def gpu_metric(gpu_type: str, zonal_redundancy: bool) -> str:
    """The quota metric of a Cloud Run GPU type: nvidia-l4 -> run.googleapis.com/nvidia_l4_gpu_allocation[...]."""
    base = f"{GPU_METRIC_PREFIX}{gpu_type.replace('-', '_')}_gpu_allocation"
    return base if zonal_redundancy else f"{base}_no_zonal_redundancy"


def gpu_quota_id(gpu_type: str, zonal_redundancy: bool) -> str:
    """The id Cloud Run's refusals name: NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion and the like."""
    words = "".join(part.capitalize() for part in gpu_type.split("-"))
    return f"{words}GpuAlloc{'' if zonal_redundancy else 'NoZonalRedundancy'}PerProjectRegion"


def gpu_raw_per_gpu(gpu_type: str) -> int:
    """Raw quota units per GPU: 1000 for a type whose quota is kept in milli-GPUs."""
    return 1000 if gpu_type in MILLI_GPU_TYPES else 1


def gpu_display_name(gpu_type: str, zonal_redundancy: bool) -> str:
    label = {"nvidia-l4": "Nvidia L4", "nvidia-rtx-pro-6000": "Nvidia RTX Pro 6000"}.get(gpu_type, gpu_type)
    milli = ", in milli GPU," if gpu_type in MILLI_GPU_TYPES else ""
    redundancy = "with" if zonal_redundancy else "without"
    return f"Total {label} GPU allocation{milli} {redundancy} zonal redundancy, per project per region"
