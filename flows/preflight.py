"""promote-model's checks before any cloud write (preflight), and the room check made again once the candidate's
revision is known: what would fail later is refused here, each finding with its fix."""

from __future__ import annotations

import math
from typing import get_args

from google.api_core import exceptions as gexc

from blocks.profile import ServingProfile
from blocks.source import ModelSource
from blocks.target import GcpTarget
from flows.delivery import Delivery
from tasks.checks.build_region import check_build_region
from tasks.checks.findings import Finding, error
from tasks.checks.in_use import Room, check_room
from tasks.checks.preflight import check_candidate_quota, check_profile, raise_on_errors
from tasks.checks.quality_budget import check_quality_budget
from tasks.checks.quotas import Need, QuotaExceeded, check_region_quotas, gpu_quota
from tasks.common import clients
from tasks.deploy.cloudrun import serving_traffic
from tasks.deploy.probe import VerifyOptions
from tasks.deploy.rollout import Rollout
from tasks.report.report import PromotionReport

_NO_RUNTIME_TOKEN = (
    "hf_token_at_runtime: the service is to get HF_TOKEN from Secret Manager, but there is no token to store; "
    "name a Prefect Secret block in token_secret_block (or set HF_TOKEN on the worker), or turn "
    "hf_token_at_runtime off"
)


def preflight(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, source: ModelSource, delivery: Delivery,
    dry_run: bool, verify: VerifyOptions | None = None,
) -> list[Need]:  # fmt: skip
    """What would fail later, refused before any cloud write: the profile's findings, a quality set too large for
    the verify window, a runtime token there is none of, a canary with no watch, the region's quotas, a build region
    Cloud Build will not build in, and the candidate's GPU beside the serving revision's. Returns the quota figures
    judged by."""
    findings = check_profile(profile, target, report.service)
    findings += check_quality_budget(delivery.quality, verify, delivery.watch)
    report.findings = raise_on_errors(_with_quota_refusal(findings, target, profile))
    if profile.hf_token_at_runtime and clients.hub_token(source) is None:
        raise ValueError(_NO_RUNTIME_TOKEN)
    if delivery.canary and delivery.samples(profile) == 0:
        raise ValueError(
            f"canary: {delivery.canary} needs each step watched, but the watch is off (watch.samples or the "
            "profile's watch_samples is 0); set watch.samples (e.g. 10), or leave canary empty"
        )
    needs = check_region_quotas(target, profile)  # vCPU, memory, GPUs: what Cloud Run would refuse at deploy
    check_build_region(target, profile)  # a build_region Cloud Build restricts the project from (reads only)
    if profile.gpu_type and not dry_run:  # a second GPU for the candidate, beside the serving revision
        report.findings += raise_on_errors(_candidate_quota(target, profile, report.service, delivery, needs))
    return needs


def _with_quota_refusal(findings: list[Finding], target: GcpTarget, profile: ServingProfile) -> list[Finding]:
    """The profile's findings and, when they refuse it anyway, the region's quota refusal too: a user fixes every
    problem in one go rather than meeting the quota after fixing the rest (reads only, no write)."""
    if not any(f.severity == "error" for f in findings):
        return findings
    try:
        check_region_quotas(target, profile)
    except QuotaExceeded as exc:
        return [*findings, error("max_instances", str(exc).removeprefix("max_instances: "))]
    return findings


def check_rollout(rollout: str) -> Rollout:
    """The rollout named, or a ValueError naming the two there are."""
    if rollout not in get_args(Rollout):
        raise ValueError(
            f"rollout: '{rollout}' is not a rollout; use zero-downtime (the candidate starts beside the serving "
            "revision) or replace (the serving revision stops first: no second GPU, but downtime)"
        )
    return rollout  # type: ignore[return-value]


def _serves(target: GcpTarget, service_id: str) -> bool:
    try:
        return bool(serving_traffic(target, service_id))
    except gexc.NotFound:
        return False


def _candidate_quota(
    target: GcpTarget, profile: ServingProfile, service_id: str, delivery: Delivery, needs: list[Need]
) -> list:
    """Whether the region's GPU quota (in ``needs``: the one GPU quota figure the quota check judged by,
    tasks/checks/quotas.gpu_need) holds the candidate beside the serving revision (zero-downtime, canary)."""
    assert profile.gpu_type is not None
    gpu = next((n for n in needs if n.quota.unit == "GPU"), None)
    limit = gpu.limit if gpu is not None else None
    quota = None if limit is None else -1 if limit == math.inf else math.floor(limit)
    quota_id = gpu_quota(profile.gpu_type, profile.gpu_zonal_redundancy).quota_id
    serving = _serves(target, service_id)
    return check_candidate_quota(profile, delivery.rollout, delivery.canary, serving, quota, target.region, quota_id)


def room_for_candidate(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, delivery: Delivery, needs: list[Need],
    labels: dict[str, str], revision: str | None = None,
) -> Room:  # fmt: skip
    """The room check (tasks/checks/in_use.py): its findings join the report's, and its errors refuse the run."""
    room = check_room(target, profile, report.service, delivery.rollout, needs, labels, revision)
    report.findings += raise_on_errors(room.findings)
    return room
