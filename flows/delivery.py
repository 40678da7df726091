"""Delivery: once the candidate is verified, traffic moves to it in steps, each step watched; a breach moves traffic
back to where it was before the run.

canary steps (each watched) -> promote (100 %, the previous revision kept warm under its tag) -> watch at 100 % ->
release the previous revision's tag. A breach, or a watch that cannot judge, sends traffic back and fails the run
with what was seen (RolledBack); a first deploy has nowhere to go back to (WatchBreached).
"""

from __future__ import annotations

from pydantic import BaseModel

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.cloudrun import (
    Candidate,
    run_abandon_candidate,
    run_promote_candidate,
    run_release_previous,
    run_shift_to_canary,
)
from tasks.delivery import (
    PREVIOUS_TAG,
    RolledBack,
    StepResult,
    WatchBreached,
    WatchOptions,
    describe_split,
    monitoring_watch_revision,
)
from tasks.gcp import InfraError
from tasks.logs import run_logger
from tasks.report import PromotionReport


class Delivery(BaseModel):
    """How traffic moves once the candidate is verified: the canary steps and the watch of each."""

    canary: list[int]
    watch: WatchOptions
    vllm_metrics: bool = False  # the Prometheus sidecar runs beside vLLM: TTFT, TPOT and stream errors are judged

    def samples(self, profile: ServingProfile) -> int:
        return self.watch.samples if self.watch.samples is not None else profile.watch_samples


def deliver(
    report: PromotionReport, target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery,
    samples: int,
) -> None:  # fmt: skip
    """Canary steps, then all traffic to the candidate, each step watched; a breach moves traffic back."""
    log = run_logger()
    canary = delivery.canary
    if canary and not candidate.previous_traffic:
        log.info("canary %s skipped: a first deploy has no serving revision to split traffic with", canary)
        canary = []
    for percent in canary:
        step = f"canary {percent} %"
        with report.step(step):
            split = run_shift_to_canary(target, service_id, candidate, percent)
            result = _watch(target, service_id, candidate, delivery, samples, step, split)
            report.delivery.append(result)
            if result.breached:
                _roll_back(target, service_id, candidate, result)
    with report.step("promote"):
        service = run_promote_candidate(target, service_id, candidate, keep_previous=samples > 0)
        report.outcome = "promoted"
        report.serving_revision = candidate.revision
    previous_url = next((s.uri for s in service.traffic_statuses if s.tag == PREVIOUS_TAG), None)
    watch_promoted(report, target, service_id, candidate, delivery, samples, previous_url, previous_url is not None)


def watch_promoted(
    report: PromotionReport, target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery,
    samples: int, previous_url: str | None, tagged: bool,
) -> None:  # fmt: skip
    """The watch at 100 %, the previous revision kept warm at its tag URL (``tagged``); then its tag goes, or traffic
    goes back."""
    if samples > 0:
        with report.step("watch"):
            keep_warm = (previous_url, candidate.service_url) if previous_url else None
            alone = [(candidate.revision, 100)]
            result = _watch(target, service_id, candidate, delivery, samples, "watch 100 %", alone, keep_warm)
            report.delivery.append(result)
            if result.breached:
                _roll_back(target, service_id, candidate, result)
    if tagged:
        run_release_previous(target, service_id, candidate)


def _watch(
    target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery, samples: int, step: str,
    split: list[tuple[str, int]], keep_warm: tuple[str, str] | None = None,
) -> StepResult:  # fmt: skip
    """One step's watch (its own task run); when it cannot judge (the metrics unreadable past their retries),
    traffic goes back as on a breach: a run that failed leaves traffic where it was."""
    try:
        return monitoring_watch_revision(target, service_id, candidate.revision, delivery.watch, samples, step, split,
                                         keep_warm, delivery.vllm_metrics)  # fmt: skip
    except Exception as exc:
        if not candidate.previous_traffic:
            raise
        run_abandon_candidate(target, service_id, candidate, "rolled-back")
        raise InfraError(
            f"{step}: the watch could not judge the candidate ({exc}); traffic is back on "
            f"{describe_split(candidate.previous_traffic)}"
        ) from exc


def _roll_back(target: GcpTarget, service_id: str, candidate: Candidate, result: StepResult) -> None:
    """Traffic back to where it was before the run, then the run fails saying what was seen."""
    if not candidate.previous_traffic:
        raise WatchBreached(
            f"{result.step} breached the SLO: {result.reason}. Nothing served before this run, so {candidate.revision} "
            "still serves: fix the model and promote again, or remove the service with teardown"
        )
    run_abandon_candidate(target, service_id, candidate, "rolled-back")
    raise RolledBack(
        f"{result.step} breached the SLO: {result.reason}; traffic is back on "
        f"{describe_split(candidate.previous_traffic)}"
    )
