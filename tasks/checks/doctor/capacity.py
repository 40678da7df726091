"""doctor's checks of capacity: the region offers the profile's GPU, Cloud Run's regional quotas hold its
``max_instances`` instances, by the same GPU quota figure preflight and scale-service judge by
(tasks/checks/quotas.py), and Cloud Build may build in the target's ``build_region`` (tasks/checks/build_region.py)."""

from __future__ import annotations

from blocks.hardware import GPUS
from blocks.profile import ServingProfile
from blocks.target import GLOBAL, GcpTarget
from tasks.checks import build_region, quotas
from tasks.checks.doctor.rows import Check, enable_command, google_text, json_error, read_denied
from tasks.image.builds import BUILD_CPU_METRIC, BUILD_CPU_TITLE, build_region_fix


def check_gpu_region(target: GcpTarget, profile: ServingProfile) -> Check:
    """The region offers the profile's GPU on Cloud Run (the catalogue in blocks/hardware.py)."""
    name = "GPU offered in region"
    if profile.gpu_type is None:
        return Check(name=name, status="ok", detail="CPU-only profile: no GPU needed.")
    regions = sorted(GPUS[profile.gpu_type].regions)
    if target.region in regions:
        return Check(name=name, status="ok", detail=f"{profile.gpu_type} is offered in {target.region}.")
    return Check(name=name, status="fail", detail=f"Cloud Run offers {profile.gpu_type} only in {', '.join(regions)}.",
                 fix=f"set the target's region to one of {', '.join(regions)} (or pick a profile whose GPU "
                 f"{target.region} offers)")  # fmt: skip


def _read_limit(target: GcpTarget, name: str, quota: quotas.Quota) -> float | Check | None:
    """The region's limit of ``quota`` as Service Usage v1beta1 reports it (None: no limit for the region), the same
    read preflight makes (tasks/checks/quotas.limit_of); or, when it cannot be read, the row that says why and how to
    fix it (the API to enable, the role to grant)."""
    response = quotas.read_metric(target, quota.metric)
    if response.status_code != 200:
        return _unread(target, name, quota.metric, response)
    return quotas.in_units(quotas.effective_limit(response.json(), target.region), quota)


def _unread(target: GcpTarget, name: str, metric: str, response) -> Check:
    """The row of a quota Service Usage refused to read: the API to enable, the role to grant, or Google's words."""
    message, disabled = json_error(response)
    if disabled:
        return Check(name=name, status="fail", detail=f"{disabled} is not enabled, so this could not be checked.",
                     fix=enable_command([disabled], target.project))  # fmt: skip
    if response.status_code == 403:
        return read_denied(name, target, message, "roles/serviceusage.serviceUsageViewer")
    return Check(
        name=name, status="warn", detail=f"could not read {metric}: {response.status_code} {google_text(message)}"
    )


def _judged(target: GcpTarget, name: str, need: quotas.Need) -> Check:
    """One regional quota, read, against what ``max_instances`` instances ask of it."""
    quota = need.quota
    if need.limit is None:
        return Check(name=name, status="warn", detail=f"{quota.metric} has no limit for {target.region}.",
                     fix=quota.console(target.project))  # fmt: skip
    if need.fits:
        return Check(name=name, status="ok", detail=f"{need.describe(target.region)}.")
    fits = need.instances_allowed
    setting = f"set the profile's max_instances to {fits}" if fits >= 1 else "pick a profile with a smaller instance"
    return Check(
        name=name, status="fail",
        detail=f"{need.describe(target.region)}: the deploy would fail with \"Max instances must be set to {fits} or "
        f"fewer\" ({quota.quota_id})",
        fix=f"request {quota.quota_id} of {quotas.raw(need.requested, quota)} ('{quota.title}') at "
        f"{quota.console(target.project)} (region {target.region}; a trial project cannot raise it), or {setting}",
    )  # fmt: skip


def _noted(row: Check, note: str) -> Check:
    """The row with ``note`` added to its detail (the artifact, DoctorFailed); the terminal keeps its line."""
    return row.model_copy(update={"summary": row.summary or row.detail, "detail": f"{row.detail} {note}"})


def _unread_gpu(row: Check, profile: ServingProfile) -> Check:
    """A GPU quota that cannot be read: the row also says what promote-model and scale-service judge by until it can
    be (tasks/checks/quotas.unread_gpus), so that doctor and the flows agree."""
    assert profile.gpu_type is not None  # only a GPU profile draws on a GPU quota
    gpus, source = quotas.unread_gpus(profile.gpu_type, profile.gpu_zonal_redundancy, profile.gpu_quota)
    figure = "no limit" if gpus is None else f"{gpus:g} GPUs"
    return _noted(row, f"Until it can be read, promote-model and scale-service judge by {figure} ({source}).")


def _read_gpu(row: Check, profile: ServingProfile, limit: float | None) -> Check:
    """A GPU quota read: a different ``gpu_quota`` in the profile is not used, and the row says so."""
    if profile.gpu_quota is None or limit is None or profile.gpu_quota == limit:
        return row
    return _noted(row, f"The profile's gpu_quota ({profile.gpu_quota}) is not used: the quota read from Google "
                       "decides; remove it from the profile.")  # fmt: skip


def check_quotas(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Cloud Run's regional quotas (vCPU, memory and, on a GPU profile, the GPU type's) cover ``max_instances``
    instances of the profile: what Cloud Run checks at deploy. The GPU row judges by the figure preflight and
    scale-service use (tasks/checks/quotas.py): Google's, read here."""
    rows = []
    for quota, per_instance in quotas.quotas_for(profile):
        name = {"vCPU": "CPU quota", "GiB": "Memory quota"}.get(quota.unit, "GPU quota")
        limit = _read_limit(target, name, quota)
        if isinstance(limit, Check):
            rows.append(_unread_gpu(limit, profile) if quota.unit == "GPU" else limit)
            continue
        row = _judged(target, name, quotas.Need(quota, per_instance, profile.max_instances, limit))
        rows.append(_read_gpu(row, profile, limit) if quota.unit == "GPU" else row)
    return rows


def check_build_region(target: GcpTarget, profile: ServingProfile) -> Check:
    """Cloud Build may build in the target's ``build_region``: 'global' always may; a region only when the project's
    "Concurrent Build CPUs (Regional Default Pool)" quota there is above 0 (the read preflight makes,
    tasks/checks/build_region.py): a project Cloud Build restricts has it at 0 outside its few regions."""
    name = "Cloud Build region"
    region = target.build_region
    if not build_region.builds(profile):
        return Check(name=name, status="ok", detail="pinned image: nothing is built.")
    if region == GLOBAL:
        return Check(name=name, status="ok", detail="builds run in Cloud Build's global default pool (build_region: "
                     "global), which every project may use; the images go to the repository in "
                     f"{target.region}.")  # fmt: skip
    response = build_region.read_build_cpus(target)
    if response.status_code != 200:
        return _unread(target, name, BUILD_CPU_METRIC, response)
    limit = build_region.build_cpus(response.json(), region)
    if limit is None:
        return Check(name=name, status="warn", detail=f"{BUILD_CPU_METRIC} has no limit for {region}: whether Cloud "
                     "Build may build there is not known until a build runs.",
                     fix="set the target's build_region to 'global' (the default)")  # fmt: skip
    if limit == 0:
        detail = (
            f"{BUILD_CPU_TITLE} ({BUILD_CPU_METRIC}) is 0 in {region}: builds there are refused with "
            "FAILED_PRECONDITION 'due to quota restrictions, cannot run builds in this region'."
        )
        summary = f"{BUILD_CPU_TITLE} is 0 in {region} (build_region): Cloud Build refuses builds there."
        return Check(name=name, status="fail", detail=detail, fix=build_region_fix(target), summary=summary)
    figure = "unlimited" if limit == float("inf") else f"{limit:g} CPUs"
    return Check(name=name, status="ok", detail=f"{BUILD_CPU_TITLE} in {region} (build_region): {figure}.")
