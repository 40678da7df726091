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


# Cloud Run GPU quotas, per project and region, as Service Usage (v1beta1 consumerQuotaMetrics) and the Cloud Quotas
# console list them: "Total Nvidia L4 GPU allocation without zonal redundancy, per project per region"
# (run.googleapis.com/nvidia_l4_gpu_allocation_no_zonal_redundancy; Cloud Run docs "GPU support for services",
# https://cloud.google.com/run/docs/configuring/services/gpu, and "GPU zonal redundancy", which link the quota
# request pages). The RTX Pro 6000 names follow the same pattern (unconfirmed: preview GPU, no public page found).
GPU_METRIC_PREFIX = "run.googleapis.com/"
QUOTA_UNIT = "1/{project}/{region}"


def gpu_metric(gpu_type: str, zonal_redundancy: bool) -> str:
    """The quota metric of a Cloud Run GPU type: nvidia-l4 -> run.googleapis.com/nvidia_l4_gpu_allocation[...]."""
    base = f"{GPU_METRIC_PREFIX}{gpu_type.replace('-', '_')}_gpu_allocation"
    return base if zonal_redundancy else f"{base}_no_zonal_redundancy"


def gpu_display_name(gpu_type: str, zonal_redundancy: bool) -> str:
    label = {"nvidia-l4": "Nvidia L4", "nvidia-rtx-pro-6000": "Nvidia RTX Pro 6000"}.get(gpu_type, gpu_type)
    redundancy = "with" if zonal_redundancy else "without"
    return f"Total {label} GPU allocation {redundancy} zonal redundancy, per project per region"
