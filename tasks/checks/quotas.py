"""Cloud Run's regional quotas, as Service Usage reports them, against what a profile's service needs.

Cloud Run counts, per project and region, the vCPU, memory and GPUs of its instances ("About maximum instances":
"These quotas are also accounted as a sum of all in-use resources in the region across of your Cloud Run
resources"), and refuses a deploy whose max instances times one instance's size exceed a quota: googlecodelabs/
feedback#2311 (Gemma 4 31B on an RTX Pro 6000, 20 vCPU / 80 GiB, a new project in us-central1):

    Max instances must be set to 0 or fewer to set the requested total memory. ... Quota violated:
    MemAllocPerProjectRegion requested: 85899345920 allowed: 42949672960

and #1856 ("CpuAllocPerProjectRegion requested: 60000 allowed: 20000"); on a trial project the quota cannot be
raised (#1868). The units, as consumerQuotaMetrics answers them:

- run.googleapis.com/cpu_allocation (CpuAllocPerProjectRegion): milli-vCPU ("Total CPU allocation, in milli vCPU,
  per project per region"; 20000 is the 20 vCPU of a new project);
- run.googleapis.com/mem_allocation (MemAllocPerProjectRegion): bytes (42949672960 is 40 GiB);
- the GPU metrics: whole GPUs for the L4 (NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion, 3 by default), but
  milli-GPUs for the RTX Pro 6000 (Google's tutorial "Run LLM inference on GPUs with Gemma 4 and Ollama": "Total
  Nvidia RTX Pro 6000 GPU allocation, in milli GPU, without zonal redundancy, per project per region";
  oded996/cr-infer's quota.py divides it by 1000), while the deploy's refusal counts whole GPUs (a write-up of the
  RTX codelab: the quota API said 1000, the deploy "NvidiaRtxPro6000GpuAllocNoZonalRedundancyPerProjectRegion
  requested: 3 allowed: 1").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import quote

from google.api_core import exceptions as gexc
from prefect import task

from blocks.hardware import GPUS
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, InfraError, gcp_errors
from tasks.common.logs import run_logger
from tasks.deploy.cloudrun import service_path

GIB = 1024**3
# Raw quota units per GPU, by GPU type: the RTX Pro 6000's quota is kept in milli-GPUs (sources above).
MILLI_GPU_TYPES = {"nvidia-rtx-pro-6000"}


@dataclass(frozen=True)
class Quota:
    """One of Cloud Run's regional quotas: its Service Usage metric, the id Cloud Run's refusal names, its unit."""

    metric: str
    quota_id: str
    title: str  # the console's name for it, to find it on the Quotas page
    raw_per_unit: int  # raw units (as the API reports them) per unit a profile is sized in
    unit: str  # vCPU, GiB, GPU
    raw_unit: str  # milli-vCPU, bytes, GPU, milli-GPU: what a quota request is filed in

    def console(self, project: str) -> str:
        return f"https://console.cloud.google.com/iam-admin/quotas?project={project}&metric={quote(self.metric)}"


CPU = Quota("run.googleapis.com/cpu_allocation", "CpuAllocPerProjectRegion",
            "Total CPU allocation, in milli vCPU, per project per region", 1000, "vCPU", "milli-vCPU")  # fmt: skip
MEMORY = Quota("run.googleapis.com/mem_allocation", "MemAllocPerProjectRegion",
               "Total memory allocation, in bytes, per project per region", GIB, "GiB", "bytes")  # fmt: skip


def gpu_quota(gpu_type: str, zonal_redundancy: bool) -> Quota:
    """The quota of a Cloud Run GPU type: run.googleapis.com/nvidia_l4_gpu_allocation_no_zonal_redundancy, whose
    id is NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion, and the like (Cloud Run docs, "GPU support for
    services"; the ids as Cloud Run's refusals and oded996/cr-infer's quota.py give them)."""
    base = f"run.googleapis.com/{gpu_type.replace('-', '_')}_gpu_allocation"
    words = "".join(part.capitalize() for part in gpu_type.split("-"))  # nvidia-rtx-pro-6000 -> NvidiaRtxPro6000
    milli = gpu_type in MILLI_GPU_TYPES
    label = f"Total {gpu_type} GPU allocation{', in milli GPU' if milli else ''}"
    scale, raw_unit = (1000, "milli-GPU") if milli else (1, "GPU")
    if zonal_redundancy:
        return Quota(base, f"{words}GpuAllocPerProjectRegion", f"{label}, per project per region", scale, "GPU",
                     raw_unit)  # fmt: skip
    return Quota(f"{base}_no_zonal_redundancy", f"{words}GpuAllocNoZonalRedundancyPerProjectRegion",
                 f"{label}, without zonal redundancy, per project per region", scale, "GPU", raw_unit)  # fmt: skip


@dataclass(frozen=True)
class Need:
    """What the service asks of one quota at ``instances`` instances, against the region's limit."""

    quota: Quota
    per_instance: float  # in quota.unit
    instances: int
    limit: float | None  # in quota.unit; None: no limit for the region; math.inf: unlimited
    source: str = ""  # where ``limit`` comes from when Service Usage could not be read (gpu_need); empty: read

    @property
    def requested(self) -> float:
        return self.per_instance * self.instances

    @property
    def fits(self) -> bool:
        return self.limit is None or self.requested <= self.limit

    @property
    def instances_allowed(self) -> int:
        if self.limit is None or self.limit == math.inf:
            return self.instances
        return math.floor(self.limit / self.per_instance + 1e-9)

    def describe(self, region: str) -> str:
        limit = "unlimited" if self.limit == math.inf else "no limit set" if self.limit is None else _n(self.limit)
        limit += f" ({self.source})" if self.source else ""
        return (
            f"{self.quota.quota_id} ({self.quota.metric}) in {region}: {_n(self.requested)} {self.quota.unit} for "
            f"{self.instances} instance(s) of {_n(self.per_instance)} {self.quota.unit}; the project has {limit}"
        )


def _n(value: float) -> str:
    return f"{value:g}"


def raw(amount: float, quota: Quota) -> str:
    """``amount`` (in the quota's unit) as a quota request is filed: 80 GiB -> '85899345920 bytes (80 GiB)'."""
    if quota.raw_per_unit == 1:
        return f"{_n(amount)} {quota.unit}"
    return f"{math.ceil(amount * quota.raw_per_unit)} {quota.raw_unit} ({_n(amount)} {quota.unit})"


def quotas_for(profile: ServingProfile) -> list[tuple[Quota, float]]:
    """The regional quotas one instance of ``profile`` draws on, with what it takes of each (its vCPU and memory
    are the instance's totals, sidecars included)."""
    needs = [(CPU, float(profile.cpu)), (MEMORY, float(profile.memory_gib))]
    if profile.gpu_type:
        needs.append((gpu_quota(profile.gpu_type, profile.gpu_zonal_redundancy), 1.0))
    return needs


def effective_limit(metric: dict, region: str) -> int | None:
    """The metric's raw limit in ``region``: its region bucket, else its default bucket; -1 means unlimited.
    A bucket without ``effectiveLimit`` is 0 (proto3 JSON leaves zero out)."""
    default = None
    for limit in metric.get("consumerQuotaLimits") or []:
        for bucket in limit.get("quotaBuckets") or []:
            dimensions = bucket.get("dimensions") or {}
            value = int(bucket.get("effectiveLimit", "0"))
            if dimensions.get("region") == region:
                return value
            if not dimensions:
                default = value
    return default


def read_metric(target: GcpTarget, metric: str):
    """Service Usage v1beta1 ``consumerQuotaMetrics.get`` of one Cloud Run quota metric, as answered."""
    api = clients.quotas(target)
    path = f"projects/{target.project}/services/run.googleapis.com/consumerQuotaMetrics/{quote(metric, safe='')}"
    return api.session.get(api.url(path))


def limit_of(target: GcpTarget, quota: Quota) -> float | None:
    """The region's limit of ``quota`` in its unit (math.inf: unlimited; None: no limit for the region). Raises a
    GoogleAPICallError when unreadable (gcp_errors names the role)."""
    with gcp_errors("serviceusage", "roles/serviceusage.serviceUsageViewer", f"reading {quota.metric}", target):
        response = read_metric(target, quota.metric)
        if response.status_code != 200:
            raise gexc.from_http_response(response)
    return in_units(effective_limit(response.json(), target.region), quota)


def in_units(raw: int | None, quota: Quota) -> float | None:
    """A raw limit in the quota's unit: -1 (unlimited) is math.inf, None (no limit for the region) stays None."""
    if raw is None:
        return None
    return math.inf if raw == -1 else raw / quota.raw_per_unit


# The one GPU quota figure: preflight (check_region_quotas, and the candidate's GPU beside the serving revision in
# flows/promote.py), scale-service (check_scale_quota) and doctor (tasks/checks/doctor/capacity.py) all judge by it.
# It is the project's quota as Service Usage reports it whenever that can be read: a quota raised with Google counts
# at once, whatever a profile says. A figure the user gives (the profile's gpu_quota, scale-service's gpu_quota) is
# used only when it cannot be read (no serviceusage.quotas.get, the API off): above Google's figure it would only
# move the refusal from preflight to the deploy, after the weights are staged and the image built; below it, it would
# refuse what Google allows (a default once saved with a profile block did exactly that). With neither, a new
# project's default is assumed (blocks/hardware.GpuSpec.default_quota), and every message built on it says so.
ASSUMED = "a new project's default, assumed; give the project's quota in gpu_quota"
STATED = "as gpu_quota gives it"


def unread_gpus(gpu_type: str, zonal_redundancy: bool, stated: int | None) -> tuple[float | None, str]:
    """The GPU quota judged by when Service Usage cannot be read, and where it comes from: ``stated`` when given,
    else a new project's default (none with zonal redundancy: it has its own quota, 0 on a new project). None for a
    GPU type the product does not know (a service deployed by other means): not judged, Cloud Run decides."""
    if stated is not None:
        return float(stated), STATED
    if zonal_redundancy:
        return 0.0, ASSUMED
    return (float(GPUS[gpu_type].default_quota), ASSUMED) if gpu_type in GPUS else (None, "unknown GPU type")


def gpu_need(
    target: GcpTarget, gpu_type: str, zonal_redundancy: bool, instances: int, stated: int | None = None,
    per_instance: float = 1.0,
) -> Need:  # fmt: skip
    """What ``instances`` instances ask of the region's GPU quota, against the one GPU quota figure (above): read from
    Service Usage, else ``stated``, else a new project's default."""
    quota = gpu_quota(gpu_type, zonal_redundancy)
    try:
        limit = limit_of(target, quota)
    except (gexc.GoogleAPICallError, InfraError) as exc:
        gpus, source = unread_gpus(gpu_type, zonal_redundancy, stated)
        run_logger().warning("%s could not be read (%s); judging by %s GPUs (%s)", quota.quota_id, exc,
                             "no limit" if gpus is None else _n(gpus), source)  # fmt: skip
        return Need(quota, per_instance, instances, gpus, f"{source}: Service Usage could not be read")
    if stated is not None and limit is not None and stated != limit:
        run_logger().warning(
            "the gpu_quota given (%s) is not used: Service Usage reads %s for %s in %s, and Google's figure decides",
            stated, _n(limit), quota.quota_id, target.region,
        )  # fmt: skip
    return Need(quota, per_instance, instances, limit)


DEPLOY_REFUSES = "Cloud Run would refuse the deploy"


def refusal(needs: list[Need], target: GcpTarget, field: str, why: str, outcome: str = DEPLOY_REFUSES) -> str | None:
    """The error for the quotas ``needs`` exceed (None when all fit): each quota by its id, metric and figures, what
    Cloud Run would do (``outcome``), the request to file, and the setting that fits without one."""
    short = [n for n in needs if not n.fits]
    if not short:
        return None
    fits = min(n.instances_allowed for n in short)
    parts = "; ".join(n.describe(target.region) for n in short)
    requests = ", ".join(
        f"{n.quota.quota_id} of {raw(n.requested, n.quota)} ('{n.quota.title}', {n.quota.console(target.project)})"
        for n in short
    )
    instead = (
        f"set {field} to {fits} or fewer" if fits >= 1
        else "pick a profile whose instance fits (fewer vCPU or less memory)"
    )  # fmt: skip
    # Cloud Run's words: for no GPU quota at all, gcloud's "You do not have quota for using GPUs without zonal
    # redundancy" (PrositAS/eskadra-bielik-misja1's README); otherwise the maxScale refusal (#1856, #2311).
    no_gpus = any(n.quota.unit == "GPU" and n.limit == 0 for n in short)
    words = (
        "You do not have quota for using GPUs ..." if no_gpus else f"Max instances must be set to {fits} or fewer ..."
    )
    return (
        f'{field}: {why} exceeds the region\'s Cloud Run quota: {parts}. {outcome} ("{words}"). Request {requests} '
        f"for region {target.region} (a trial project cannot raise it), or {instead}"
    )


class QuotaExceeded(ValueError):
    """The region's Cloud Run quotas cannot hold the service: refused before anything is written."""


def check_region_quotas(target: GcpTarget, profile: ServingProfile) -> list[Need]:
    """Refuse, before any write, a profile whose ``max_instances`` the region's vCPU, memory or GPU quota cannot
    hold: Cloud Run would refuse it only at the deploy, after the weights are staged and the image built. Returns
    the figures judged by, for the checks that follow. vCPU and memory quotas that cannot be read (no
    serviceusage.quotas.get, the API off) are logged and left to the deploy (none returned); the GPU quota is always
    judged, by the one GPU quota figure (gpu_need)."""
    instances = profile.max_instances
    try:
        needs = [Need(q, per, instances, limit_of(target, q)) for q, per in quotas_for(profile) if q.unit != "GPU"]
    except (gexc.GoogleAPICallError, InfraError) as exc:
        run_logger().warning("the region's Cloud Run quotas could not be read, so the deploy checks them: %s", exc)
        needs = []
    if profile.gpu_type:
        needs.append(gpu_need(target, profile.gpu_type, profile.gpu_zonal_redundancy, instances, profile.gpu_quota))
    gpu = f" and a {profile.gpu_type} GPU" if profile.gpu_type else ""
    message = refusal(
        needs, target, "max_instances",
        f"{profile.max_instances} instance(s) of {profile.cpu} vCPU, {profile.memory_gib} GiB{gpu}",
    )  # fmt: skip
    if message:
        raise QuotaExceeded(message)
    return needs


# Cloud Run takes a service-level maximum over the GPU quota (it refuses one only with a new revision): the instances
# above the quota would just never start, so scale-service checks it here.
SCALING_ACCEPTED = "Cloud Run would take the setting, and the instances above the quota would never start"


def check_scale_quota(target: GcpTarget, service_id: str, max_instances: int | None, stated: int | None = None) -> None:
    """Refuse a ``max_instances`` whose GPUs (the service's GPU type, times its GPUs per instance) the region's GPU
    quota cannot hold, by the same figure preflight judges a profile by (gpu_need); ``stated``: the quota scale-service
    was given, used only when Service Usage cannot be read. A CPU-only service, or no new maximum, is not checked."""
    if max_instances is None:
        return
    with gcp_errors("run", "roles/run.viewer", f"reading service {service_id}", target):
        try:
            service = clients.run_services(target).get_service(name=service_path(target, service_id), retry=GCP_RETRY)
        except gexc.NotFound:
            return  # nothing to scale: scale-service says so
    template = service.template
    gpu_type = template.node_selector.accelerator
    per_instance = max((int(c.resources.limits.get("nvidia.com/gpu") or 0) for c in template.containers), default=0)
    if not gpu_type or per_instance == 0:
        return
    zonal = not template.gpu_zonal_redundancy_disabled
    need = gpu_need(target, gpu_type, zonal, max_instances, stated, float(per_instance))
    why = f"{max_instances} instances of {service_id} with {per_instance} {gpu_type} GPU each"
    message = refusal([need], target, "max_instances", why, SCALING_ACCEPTED)
    if message:
        raise QuotaExceeded(message)


run_check_scale_quota = task(name="run_check_scale_quota")(check_scale_quota)
