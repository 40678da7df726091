"""What the region's Cloud Run resources hold now, and whether a new instance fits beside them.

Cloud Run's regional quotas count "a sum of all in-use resources in the region across of your Cloud Run resources"
("About maximum instances"): every running instance of every service, and every running job task (this pipeline's
own job on a cloud-run-v2 pool among them). An instance that would take the region past a quota does not start, and
its revision fails ("Quota exceeded for total allowable memory per project per region.": public deploy notes of a
40 GiB us-central1 project redeploying 8 GiB services with instances running). On a new project (20 vCPU, 40 GiB)
one L4 instance (8 vCPU, 32 GiB) leaves no room for a second: a zero-downtime re-promotion, or a second service,
would fail only at the deploy, after the weights are staged and the image built. Preflight adds it up first.

Where the figures come from, each the best a caller can read:
- a revision's instances: the newest point of Cloud Monitoring's ``run.googleapis.com/container/instance_count``
  ("Number of container instances that exist, broken down by state": active and idle both hold resources; sampled
  every 60 s, visible up to 180 s later), never fewer than its minimum (service-level minimums go to the revisions
  serving traffic, revision-level ones to revisions in the split or tagged, a manual count to those taking traffic);
  the serving revisions of the service being promoted count at least one each, since they keep serving beside a
  zero-downtime candidate;
- an instance's size: the revision's containers' limits, summed (Cloud Run's 1 vCPU / 512 MiB for a container
  without limits), and its GPU;
- a job: each running execution's running tasks, at its task template's size.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from google.api_core import exceptions as gexc
from google.cloud import run_v2

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.checks.findings import Finding, error
from tasks.checks.quotas import CPU, MEMORY, Need, Quota, raw
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, InfraError, gcp_errors
from tasks.common.logs import run_logger
from tasks.watch.monitoring import list_series, parse_time

INSTANCE_COUNT = "run.googleapis.com/container/instance_count"
GPU_LIMIT = "nvidia.com/gpu"
# How far back the newest instance_count point is looked for: Cloud Run keeps an idle instance up to 15 minutes.
LOOKBACK = timedelta(minutes=15)
QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
UNITS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


@dataclass(frozen=True)
class Holder:
    """Instances (or job tasks) of one revision (or job) that hold the region's quotas now."""

    name: str  # "service svc-a, revision svc-a-00002-abc" / "job hf-pipeline-x"
    count: int
    cpu: float  # per instance, vCPU
    memory_gib: float
    gpu_type: str = ""
    gpus: int = 0
    own: bool = False  # a revision of the service being promoted
    labels: dict[str, str] = field(default_factory=dict)  # the revision's
    revision: str = ""  # its short name, for a service's revision

    def holds(self, quota: Quota, gpu_type: str | None) -> float:
        if quota is CPU:
            return self.count * self.cpu
        if quota is MEMORY:
            return self.count * self.memory_gib
        return self.count * self.gpus if gpu_type and self.gpu_type == gpu_type else 0.0

    def describe(self, quota: Quota, gpu_type: str | None) -> str:
        return f"{self.name}: {self.count} x {_n(self.holds(quota, gpu_type) / self.count)} {quota.unit}"


def _n(value: float) -> str:
    return f"{value:g}"


def quantity(value: str, default: str) -> float:
    match = QUANTITY.match((value or default).strip())
    if not match:
        match = QUANTITY.match(default)
        assert match is not None
    return float(match.group(1)) * UNITS[match.group(2)]


def size_of(containers, accelerator: str) -> tuple[float, float, int]:
    """One instance's vCPU, GiB and GPUs: its containers' limits summed, Cloud Run's defaults where none is set."""
    cpu = memory = 0.0
    gpus = 0
    for container in containers:
        limits = dict(container.resources.limits)
        cpu += quantity(limits.get("cpu", ""), "1")
        memory += quantity(limits.get("memory", ""), "512Mi") / 2**30
        gpus += int(quantity(limits.get(GPU_LIMIT, ""), "0"))
    return cpu, memory, gpus if accelerator else 0


def minimums(service: run_v2.Service, revisions: dict[str, run_v2.Revision]) -> dict[str, int]:
    """The instances each revision keeps by its service's or its own minimum (or the manual count)."""
    split = {s.revision: s.percent for s in service.traffic_statuses if s.revision and s.percent}
    tagged = {s.revision for s in service.traffic_statuses if s.revision and s.tag}
    scaling = service.scaling
    manual = scaling.scaling_mode == run_v2.ServiceScaling.ScalingMode.MANUAL
    floor = scaling.manual_instance_count if manual else scaling.min_instance_count
    kept = {name: math.ceil(floor * percent / 100) for name, percent in split.items()}
    if not manual:
        for name, revision in revisions.items():
            if name in split or name in tagged:
                kept[name] = max(kept.get(name, 0), revision.scaling.min_instance_count)
    return kept


def observed_instances(target: GcpTarget) -> dict[tuple[str, str], int]:
    """Each (service, revision)'s instance_count in the newest sampling period Cloud Monitoring has for the region:
    what ran a minute or three ago (points are visible up to 180 s after their period)."""
    end = datetime.now(UTC)
    series = list_series(
        target,
        f'metric.type = "{INSTANCE_COUNT}" AND resource.type = "cloud_run_revision" AND '
        f'resource.labels.location = "{target.region}"',
        end - LOOKBACK,
        end,
    )
    newest: dict[tuple[str, str], tuple[datetime, int]] = {}
    for each in series:
        labels = each.get("resource", {}).get("labels", {})
        key = (labels.get("service_name", ""), labels.get("revision_name", ""))
        for point in each.get("points", []):
            stamp, value = parse_time(point["interval"]["endTime"]), int(point["value"].get("int64Value", 0))
            if key not in newest or stamp > newest[key][0]:
                newest[key] = (stamp, value)
            elif stamp == newest[key][0]:  # another state (active, idle) of the same period
                newest[key] = (stamp, newest[key][1] + value)
    # A revision whose newest point is older than the newest periods Monitoring can show yet has no instance now: it
    # stopped since (twice the sampling period and its visibility delay: points arrive late, and not all at once).
    horizon = end - 2 * timedelta(seconds=target.metrics_sample_seconds + target.metrics_delay_seconds)
    return {key: value for key, (stamp, value) in newest.items() if stamp >= horizon}


def service_holders(target: GcpTarget, own_service: str, own_serving: bool) -> list[Holder]:
    """Every service's revisions that hold instances now (the figures above)."""
    try:
        observed = observed_instances(target)
    except (gexc.GoogleAPICallError, InfraError) as exc:
        run_logger().warning("Cloud Monitoring's instance counts could not be read (%s): judging by minimums", exc)
        observed = {}
    holders = []
    services = clients.run_services(target).list_services(parent=target.location_path, retry=GCP_RETRY)
    for service in services:
        service_id = service.name.rsplit("/", 1)[1]
        serving = {s.revision for s in service.traffic_statuses if s.revision and s.percent}
        names = serving | {s.revision for s in service.traffic_statuses if s.revision and s.tag}
        names |= {revision for (sid, revision) in observed if sid == service_id}
        revisions = {name: _revision(target, service.name, name) for name in names}
        floors = minimums(service, {n: r for n, r in revisions.items() if r is not None})
        for name, revision in revisions.items():
            own = service_id == own_service
            at_least = 1 if own and own_serving and name in serving else 0
            count = max(observed.get((service_id, name), 0), floors.get(name, 0), at_least)
            if revision is None or count == 0:
                continue
            accelerator = revision.node_selector.accelerator
            cpu, memory, gpus = size_of(revision.containers, accelerator)
            holders.append(Holder(f"service {service_id}, revision {name}", count, cpu, memory, accelerator, gpus, own,
                                  dict(revision.labels), name))  # fmt: skip
    return holders


def _revision(target: GcpTarget, service_name: str, short: str) -> run_v2.Revision | None:
    try:
        return clients.run_revisions(target).get_revision(name=f"{service_name}/revisions/{short}", retry=GCP_RETRY)
    except gexc.NotFound:
        return None  # deleted since Monitoring saw it


def job_holders(target: GcpTarget) -> list[Holder]:
    """Every running job execution's running tasks (this pipeline's own job among them)."""
    holders = []
    for job in clients.run_jobs(target).list_jobs(parent=target.location_path, retry=GCP_RETRY):
        latest = job.latest_created_execution
        if not latest.name or latest.completion_time:
            continue
        execution = clients.run_executions(target).get_execution(name=latest.name, retry=GCP_RETRY)
        if execution.running_count:
            cpu, memory, _ = size_of(job.template.template.containers, "")
            holders.append(Holder(f"job {job.name.rsplit('/', 1)[1]}", execution.running_count, cpu, memory))
    return holders


def region_holders(target: GcpTarget, service_id: str, own_serving: bool) -> list[Holder]:
    """What holds the region's Cloud Run quotas now: services' instances and jobs' running tasks."""
    with gcp_errors("run", "roles/run.viewer", "reading what runs in the region", target):
        return [*service_holders(target, service_id, own_serving), *job_holders(target)]


WEIGHT_LABELS = ("hf-model", "hf-commit")


@dataclass(frozen=True)
class Room:
    """The room check's findings, and whether it was put off: the service serves these weights already, so whether
    a candidate is made at all is known only once the image is resolved (``check_room`` again with its revision)."""

    findings: list[Finding]
    deferred: bool = False


def check_room(
    target: GcpTarget, profile: ServingProfile, service_id: str, rollout: str, needs: list[Need],
    planned_labels: dict[str, str], revision: str | None = None,
) -> Room:  # fmt: skip
    """Refuse a candidate whose one instance the region's quotas cannot hold beside what runs now (``needs``: the
    limits check_region_quotas read). Zero-downtime keeps the service's serving revisions up beside it; replace stops
    them first, so they are not counted.

    Before the image is known (``revision`` None), a service already serving these weights (``planned_labels``'
    model and commit) is not judged: a rerun with the same inputs makes no candidate. The flow asks again with the
    rendered ``revision`` (weights, image and profile in its name): a revision the service has running makes no
    candidate; any other (a new image, new flags) is judged like new weights, before the deploy."""
    limits = {n.quota.metric: n for n in needs if n.limit is not None and n.limit != math.inf}
    if not limits:
        return Room([])
    replace = rollout == "replace"
    holders = region_holders(target, service_id, own_serving=not replace)
    own = [h for h in holders if h.own]
    if revision is None and any(all(h.labels.get(k) == planned_labels.get(k) for k in WEIGHT_LABELS) for h in own):
        return Room([], deferred=True)
    if revision is not None and any(h.revision == revision for h in own):
        return Room([])
    if replace:  # the service's own instances stop before the candidate starts
        holders = [h for h in holders if not h.own]
    candidate = {CPU.metric: float(profile.cpu), MEMORY.metric: float(profile.memory_gib)}
    findings = []
    for metric, need in limits.items():
        want = candidate.get(metric, 1.0)  # a GPU quota: the candidate's one GPU
        held = [h for h in holders if h.holds(need.quota, profile.gpu_type)]
        in_use = sum(h.holds(need.quota, profile.gpu_type) for h in held)
        assert need.limit is not None
        if in_use + want <= need.limit + 1e-9:
            continue
        findings.append(error("rollout", _no_room(target, profile, need, held, in_use, want, rollout), 6))
    return Room(findings)


def _no_room(
    target: GcpTarget, profile: ServingProfile, need: Need, held: list[Holder], in_use: float, want: float,
    rollout: str,
) -> str:  # fmt: skip
    quota = need.quota
    assert need.limit is not None
    own = sum(h.holds(quota, profile.gpu_type) for h in held if h.own)
    listed = "; ".join(h.describe(quota, profile.gpu_type) for h in held) or "nothing"
    ways = [f"request {quota.quota_id} of {raw(in_use + want, quota)} for {target.region} ('{quota.title}', "
            f"{quota.console(target.project)})"]  # fmt: skip
    if rollout != "replace" and own and in_use - own + want <= need.limit + 1e-9:
        ways.insert(0, "set rollout: replace (the serving revision stops first, and the service answers 503 until "
                       "the candidate takes its traffic)")  # fmt: skip
    else:
        ways.append("stop or scale down what holds it")
    return (
        f"the candidate's instance needs {_n(want)} {quota.unit} of {quota.quota_id} ({quota.metric}) in "
        f"{target.region}, beside {_n(in_use)} {quota.unit} in use ({listed}): {_n(in_use + want)} of the "
        f"project's {_n(need.limit)} {quota.unit}. Cloud Run would not start it (\"Quota exceeded for total "
        f'allowable {_quota_word(quota)} per project per region."), after the weights are staged and the image '
        f"built. Either {', or '.join(ways)}"
    )


def _quota_word(quota: Quota) -> str:
    return {"vCPU": "CPU", "GiB": "memory"}.get(quota.unit, "count of GPUs")
