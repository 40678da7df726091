"""The replace rollout, for a GPU quota that cannot hold the candidate beside the serving revision (one RTX Pro 6000).

The serving revision stops before the candidate is deployed, freeing its GPU (tasks/deploy/rollout.py); once the
candidate is verified it takes all traffic and the service scales automatically again, in one update, and the report
gives the downtime. A candidate that fails to deploy or to verify gives the GPU back: the old revision serves again.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from google.api_core import exceptions as gexc
from google.cloud import run_v2

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from flows.delivery import Delivery, DeliveryRun, fenced, watch_plan, watch_promoted
from flows.service_lock import ServiceLock
from tasks.common.logs import run_logger
from tasks.deploy import verdicts
from tasks.deploy.cloudrun import GPU_RELEASE_DEADLINE_S, revision_names, serving_traffic
from tasks.deploy.rollout import run_resume_serving, run_stop_serving, run_wait_answering
from tasks.report.report import PromotionReport
from tasks.watch.canary import RolledBack


class Stopped(NamedTuple):
    """A service a replace rollout stopped: the scaling to resume with, when it stopped serving, and the traffic it
    served then."""

    scaling: run_v2.ServiceScaling
    at: float  # time.monotonic()
    serving: list[tuple[str, int]]

    @property
    def since(self) -> float:
        return time.monotonic() - self.at


def stop_for_replace(target: GcpTarget, service_id: str, spec: run_v2.Service, delivery: Delivery) -> Stopped | None:
    """With the replace rollout, the serving revision stops before the candidate is deployed (its GPU freed); None
    when there is nothing to replace (a first deploy, the same revision)."""
    if delivery.rollout != "replace":
        return None
    try:
        serving = serving_traffic(target, service_id)
    except gexc.NotFound:
        return None
    if not serving or (len(serving) == 1 and serving[0][0] in revision_names(spec.template.revision)):
        return None  # it serves this spec already (under a later name when earlier tries failed): nothing to replace
    stopped = Stopped(run_stop_serving(target, service_id), time.monotonic(), serving)
    run_logger().warning(
        "replace rollout: %s serves nothing from now until %s takes its traffic (the GPU quota holds one of them)",
        service_id, spec.template.revision,
    )  # fmt: skip
    return stopped


def resume_after_failed_replace(
    report: PromotionReport, target: GcpTarget, service_id: str, stopped: Stopped, profile: ServingProfile,
    lock: ServiceLock,
) -> None:  # fmt: skip
    """The candidate never started, or failed verification: the old revision serves again, from a cold start once
    a GPU is free. A failure here is logged, not raised: the candidate's failure is the run's story."""
    try:
        fenced(lock, target, service_id, stopped.serving, "resume the old revision")
        resume_old_revision(report, target, service_id, stopped, profile)
    except Exception as exc:
        run_logger().error(
            "replace rollout: %s could not be switched back to automatic scaling (%s); it serves nothing until this "
            "promotion runs again (a rerun finds it stopped and resumes it)", service_id, exc,
        )  # fmt: skip


def resume_old_revision(
    report: PromotionReport, target: GcpTarget, service_id: str, stopped: Stopped, profile: ServingProfile
) -> None:
    """The candidate of a replace rollout is abandoned (traffic back on the old revision, its tag gone) while the
    service is still at manual 0, so its instance has stopped: an idle one would hold the GPU for up to 15 minutes.
    Then automatic scaling again, and the old revision serves from a cold start once Cloud Run has released the
    GPU; the report says when it answered, or that it did not yet."""
    run_resume_serving(target, service_id, stopped.scaling, profile.max_instances)
    answered = run_wait_answering(target, service_id)
    if answered is None:
        report.downtime = (
            f"{stopped.since:.0f} s so far: the old revision did not answer within {GPU_RELEASE_DEADLINE_S:.0f} s "
            "of resuming (its cold start needs a free GPU); it starts on its next request once one is"
        )
        run_logger().warning("replace rollout: %s does not answer yet: %s", service_id, report.downtime)
        return
    report.downtime = (
        f"{stopped.since:.0f} s (replace rollout: the old revision answered again {answered:.0f} s after resuming)"
    )


def give_gpu_back(
    report: PromotionReport, target: GcpTarget, service_id: str, stopped: Stopped, profile: ServingProfile
) -> None:
    """After a breach at 100 % the candidate, rolled back, would stay up idle with the only GPU: manual 0 stops it
    (a revision with neither traffic nor a tag gets no instance under manual scaling), then the old revision
    resumes as after a failed verification."""
    run_stop_serving(target, service_id)
    resume_old_revision(report, target, service_id, stopped, profile)


def deliver_in_place(report: PromotionReport, run: DeliveryRun, stopped: Stopped, profile: ServingProfile) -> None:
    """The verified candidate takes all traffic and the service scales automatically again, in one update; the
    watch follows at 100 %, with no previous revision kept warm (there is no GPU for it)."""
    _, run = watch_plan(report, run)
    candidate = run.candidate
    with report.step("promote"):
        run.fenced(candidate.left_serving, "promote")
        run_resume_serving(run.target, run.service_id, stopped.scaling, profile.max_instances, candidate.revision)
        verdicts.record(run.target, candidate.service, candidate.revision, "verified")
        report.downtime = (
            f"{stopped.since:.0f} s (replace rollout: from stopping {candidate.previous_revision} to "
            f"{candidate.revision} taking all traffic)"
        )
        report.outcome = "promoted"
        report.serving_revision = candidate.revision
    try:
        watch_promoted(report, run.at_100(), previous_url=None)
    except RolledBack:  # traffic is back on the old revision, whose GPU the idle candidate holds
        give_gpu_back(report, run.target, run.service_id, stopped, profile)
        raise
