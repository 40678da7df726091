"""Delivery: once the candidate is verified, traffic moves to it in steps, each step watched; a breach moves traffic
back to where it was before the run.

canary steps (each watched) -> promote (100 %, the previous revision kept warm under its tag) -> watch at 100 % ->
release the previous revision's tag. A breach, or a watch that cannot judge, sends traffic back and fails the run
with what was seen (RolledBack).

A watch waits only when it can judge something: a first deploy has no revision to go back to, so it is not watched;
a service whose serving revision had too little traffic lately to judge a step is promoted without the watch, or
with the verify step's own requests as its load (the profile's watch_without_traffic). The report says which.

Every write is fenced by the service lock (flows/service_lock.py): if the lock lapsed on the way (the Prefect server
out of reach for longer than the lease), the run goes on only once it holds it again and the service still serves
what this run left; otherwise it stops without another write (ServiceChanged), leaving the service to the run that
changed it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from flows.service_lock import ServiceLock
from tasks.common.gcp import InfraError
from tasks.common.logs import run_logger
from tasks.common.naming import PREVIOUS_TAG
from tasks.deploy.cloudrun import (
    Candidate,
    run_abandon_candidate,
    run_promote_candidate,
    run_release_previous,
    run_shift_to_canary,
    serving_traffic,
)
from tasks.deploy.rollout import Rollout
from tasks.deploy.traffic import describe_split
from tasks.report.report import PromotionReport
from tasks.watch.canary import (
    RolledBack,
    StepResult,
    WatchBreached,
    WatchLoad,
    WatchOptions,
    monitoring_read_served_requests,
    monitoring_watch_revision,
)

QUIET_PERIODS = 10  # sampling periods a quiet service is judged over, at least: 10 minutes on Cloud Run


class Delivery(BaseModel):
    """How traffic moves once the candidate is verified: the canary steps and the watch of each; and how the
    candidate gets its GPU (``rollout``: beside the serving revision, or in its place: tasks/deploy/rollout.py)."""

    canary: list[int]
    watch: WatchOptions
    rollout: Rollout = "zero-downtime"
    vllm_metrics: bool = False  # the Prometheus sidecar runs beside vLLM: TTFT, TPOT and stream errors are judged
    without_traffic: Literal["skip", "load"] = "skip"  # the profile's watch_without_traffic
    served_name: str = ""  # what the candidate serves: the load's requests name it

    def samples(self, profile: ServingProfile) -> int:
        return self.watch.samples if self.watch.samples is not None else profile.watch_samples


class ServiceChanged(RuntimeError):
    """Another run changed the service while this run's lock had lapsed: this run made no further change."""


def fenced(lock: ServiceLock, target: GcpTarget, service_id: str, expected: list[tuple[str, int]], step: str) -> None:
    """Before a write: the lock is renewed; if it lapsed since the last write, the service must still serve
    ``expected`` (what this run left it serving), else the run stops here."""
    if not lock.fence():
        return
    now = serving_traffic(target, service_id)
    if sorted(now) != sorted(expected):
        raise ServiceChanged(
            f"{step}: this run's lock on {service_id} lapsed (the Prefect server was out of reach for longer than the "
            f"lease) and another run changed the service meanwhile: it serves {describe_split(now)}, where this run "
            f"left {describe_split(expected)}. This run made no change after that; check the service, then run "
            "promote-model or rollback-model again"
        )
    run_logger().info("%s: the service is as this run left it after its lock lapsed; going on", step)


def deliver(
    report: PromotionReport, target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery,
    samples: int, lock: ServiceLock,
) -> None:  # fmt: skip
    """Canary steps, then all traffic to the candidate, each step watched; a breach moves traffic back."""
    canary, samples, load = watch_plan(report, target, service_id, candidate, delivery, samples)
    now = candidate.left_serving
    for percent in canary:
        step = f"canary {percent} %"
        with report.step(step):
            fenced(lock, target, service_id, now, step)
            now = run_shift_to_canary(target, service_id, candidate, percent)
            result = _watch(target, service_id, candidate, delivery, samples, step, now, lock, load=load)
            report.delivery.append(result)
            if result.breached:
                _roll_back(target, service_id, candidate, result, now, lock)
    with report.step("promote"):
        fenced(lock, target, service_id, now, "promote")
        service = run_promote_candidate(target, service_id, candidate, keep_previous=samples > 0)
        report.outcome = "promoted"
        report.serving_revision = candidate.revision
    previous_url = next((s.uri for s in service.traffic_statuses if s.tag == PREVIOUS_TAG), None)
    watch_promoted(
        report, target, service_id, candidate, delivery, samples, previous_url, previous_url is not None, lock,
        at_100(load, candidate),
    )  # fmt: skip


def at_100(load: WatchLoad | None, candidate: Candidate) -> WatchLoad | None:
    """The load at 100 %: the candidate has lost its tag, and answers at the service URL."""
    return load.model_copy(update={"url": candidate.service_url}) if load else None


def watch_plan(
    report: PromotionReport, target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery, samples: int
) -> tuple[list[int], int, WatchLoad | None]:
    """The canary steps, the samples of each watch and its load, once it is known what a watch could judge: said in
    the log before anything waits, and in the report."""
    log = run_logger()
    if not candidate.previous_traffic:  # a first deploy (or one whose first run died before verifying)
        if samples:
            report.notes.append(
                "watch skipped: a first deploy has no earlier revision to go back to, so a breach could change "
                "nothing; the next promotion of this service is watched"
            )
            log.info("%s", report.notes[-1])
        if delivery.canary:
            log.info("canary %s skipped: a first deploy has no serving revision to split traffic with", delivery.canary)
        return [], 0, None
    if not samples:
        return delivery.canary, 0, None
    # Over the watch's window, and no shorter than QUIET_PERIODS: a couple of quiet minutes on a service with users
    # is chance, not a quiet service. Plus Monitoring's delay, so that the span read is whole periods already shown.
    lookback = max(samples, QUIET_PERIODS) * target.metrics_sample_seconds + target.metrics_delay_seconds
    served = monitoring_read_served_requests(target, service_id, candidate.previous_traffic, lookback)
    if served is None or served >= delivery.watch.min_requests:
        return delivery.canary, samples, None
    quiet = (
        f"{describe_split(candidate.previous_traffic)} served {served} requests in the last {lookback:.0f} s, fewer "
        f"than the watch's min_requests ({delivery.watch.min_requests}): a watch would end 'too little traffic'"
    )
    if delivery.without_traffic == "skip":
        report.notes.append(f"watch skipped: {quiet} (the profile's watch_without_traffic: skip)")
        log.info("%s; promoting without it", report.notes[-1])
        return [], 0, None
    report.notes.append(f"watch loaded: {quiet}, so each step sends the verify step's request "
                        f"{delivery.watch.min_requests} times to the candidate (watch_without_traffic: "
                        "load)")  # fmt: skip
    log.info("%s", report.notes[-1])
    load = WatchLoad(url=candidate.url, audience=candidate.service_url, served_name=delivery.served_name,
                     requests=delivery.watch.min_requests)  # fmt: skip
    return delivery.canary, samples, load


def watch_promoted(
    report: PromotionReport, target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery,
    samples: int, previous_url: str | None, tagged: bool, lock: ServiceLock, load: WatchLoad | None = None,
) -> None:  # fmt: skip
    """The watch at 100 %, the previous revision kept warm at its tag URL (``tagged``); then its tag goes, or traffic
    goes back. ``load``: the requests the watch sends itself (the service's own traffic is too little to judge)."""
    if samples > 0:
        with report.step("watch"):
            keep_warm = (previous_url, candidate.service_url) if previous_url else None
            alone = [(candidate.revision, 100)]
            result = _watch(target, service_id, candidate, delivery, samples, "watch 100 %", alone, lock, keep_warm,
                            load)  # fmt: skip
            report.delivery.append(result)
            if result.breached:
                _roll_back(target, service_id, candidate, result, alone, lock)
    if tagged:
        fenced(lock, target, service_id, [(candidate.revision, 100)], "release the previous revision")
        run_release_previous(target, service_id, candidate)


def _watch(
    target: GcpTarget, service_id: str, candidate: Candidate, delivery: Delivery, samples: int, step: str,
    split: list[tuple[str, int]], lock: ServiceLock, keep_warm: tuple[str, str] | None = None,
    load: WatchLoad | None = None,
) -> StepResult:  # fmt: skip
    """One step's watch (its own task run); when it cannot judge (the metrics unreadable past their retries),
    traffic goes back as on a breach: a run that failed leaves traffic where it was."""
    try:
        return monitoring_watch_revision(target, service_id, candidate.revision, delivery.watch, samples, step, split,
                                         keep_warm, delivery.vllm_metrics, load)  # fmt: skip
    except Exception as exc:
        if not candidate.previous_traffic:
            raise
        fenced(lock, target, service_id, split, f"{step}: roll back")
        run_abandon_candidate(target, service_id, candidate, "rolled-back")
        raise InfraError(
            f"{step}: the watch could not judge the candidate ({exc}); traffic is back on "
            f"{describe_split(candidate.previous_traffic)}"
        ) from exc


def _roll_back(
    target: GcpTarget, service_id: str, candidate: Candidate, result: StepResult, split: list[tuple[str, int]],
    lock: ServiceLock,
) -> None:  # fmt: skip
    """Traffic back to where it was before the run (from ``split``), then the run fails saying what was seen."""
    if not candidate.previous_traffic:
        raise WatchBreached(
            f"{result.step} breached the SLO: {result.reason}. Nothing served before this run, so {candidate.revision} "
            "still serves: fix the model and promote again, or remove the service with teardown"
        )
    fenced(lock, target, service_id, split, f"{result.step}: roll back")
    run_abandon_candidate(target, service_id, candidate, "rolled-back")
    raise RolledBack(
        f"{result.step} breached the SLO: {result.reason}; traffic is back on "
        f"{describe_split(candidate.previous_traffic)}"
    )
