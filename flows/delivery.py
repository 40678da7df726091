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

from dataclasses import dataclass, replace
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
from tasks.quality.spec import QualitySet
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
    quality: QualitySet | None = None  # the quality set judged before any traffic moves (flows/gate.py)

    def samples(self, profile: ServingProfile) -> int:
        return self.watch.samples if self.watch.samples is not None else profile.watch_samples


class ServiceChanged(RuntimeError):
    """Another run changed the service while this run's lock had lapsed: this run made no further change."""


@dataclass(frozen=True)
class DeliveryRun:
    """What every step of one promotion's delivery reads, travelling together: the service and its verified
    candidate, how traffic moves (``delivery``), the sampling periods each step is watched for (``samples``, 0: no
    watch), the requests a watch sends itself when the service is too quiet to judge (``load``), and the service lock
    that fences each write."""

    target: GcpTarget
    service_id: str
    candidate: Candidate
    delivery: Delivery
    samples: int
    lock: ServiceLock
    load: WatchLoad | None = None

    def fenced(self, expected: list[tuple[str, int]], step: str) -> None:
        """Before a write: ``fenced`` on this run's lock and service."""
        fenced(self.lock, self.target, self.service_id, expected, step)

    def at_100(self) -> DeliveryRun:
        """The run once the candidate takes all traffic: it has lost its tag, so the load goes to the service URL."""
        if self.load is None:
            return self
        return replace(self, load=self.load.model_copy(update={"url": self.candidate.service_url}))


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


def deliver(report: PromotionReport, run: DeliveryRun) -> None:
    """Canary steps, then all traffic to the candidate, each step watched; a breach moves traffic back."""
    canary, run = watch_plan(report, run)
    now = run.candidate.left_serving
    for percent in canary:
        step = f"canary {percent} %"
        with report.step(step):
            run.fenced(now, step)
            now = run_shift_to_canary(run.target, run.service_id, run.candidate, percent)
            result = _watch(run, step, now)
            report.delivery.append(result)
            if result.breached:
                _roll_back(run, result, now)
    with report.step("promote"):
        run.fenced(now, "promote")
        service = run_promote_candidate(run.target, run.service_id, run.candidate, keep_previous=run.samples > 0)
        report.outcome = "promoted"
        report.serving_revision = run.candidate.revision
    previous_url = next((s.uri for s in service.traffic_statuses if s.tag == PREVIOUS_TAG), None)
    watch_promoted(report, run.at_100(), previous_url=previous_url)


def watch_plan(report: PromotionReport, run: DeliveryRun) -> tuple[list[int], DeliveryRun]:
    """The canary steps, and the run with the samples of each watch and its load, once it is known what a watch could
    judge: said in the log before anything waits, and in the report."""
    log = run_logger()
    candidate, delivery = run.candidate, run.delivery
    if not candidate.previous_traffic:  # a first deploy (or one whose first run died before verifying)
        if run.samples:
            report.notes.append(
                "watch skipped: a first deploy has no earlier revision to go back to, so a breach could change "
                "nothing; the next promotion of this service is watched"
            )
            log.info("%s", report.notes[-1])
        if delivery.canary:
            log.info("canary %s skipped: a first deploy has no serving revision to split traffic with", delivery.canary)
        return [], replace(run, samples=0, load=None)
    if not run.samples:
        return delivery.canary, replace(run, load=None)
    # Over the watch's window, and no shorter than QUIET_PERIODS: a couple of quiet minutes on a service with users
    # is chance, not a quiet service. Plus Monitoring's delay, so that the span read is whole periods already shown.
    target = run.target
    lookback = max(run.samples, QUIET_PERIODS) * target.metrics_sample_seconds + target.metrics_delay_seconds
    served = monitoring_read_served_requests(target, run.service_id, candidate.previous_traffic, lookback)
    if served is None or served >= delivery.watch.min_requests:
        return delivery.canary, replace(run, load=None)
    quiet = (
        f"{describe_split(candidate.previous_traffic)} served {served} requests in the last {lookback:.0f} s, fewer "
        f"than the watch's min_requests ({delivery.watch.min_requests}): a watch would end 'too little traffic'"
    )
    if delivery.without_traffic == "skip":
        report.notes.append(f"watch skipped: {quiet} (the profile's watch_without_traffic: skip)")
        log.info("%s; promoting without it", report.notes[-1])
        return [], replace(run, samples=0, load=None)
    report.notes.append(f"watch loaded: {quiet}, so each step sends the verify step's request "
                        f"{delivery.watch.min_requests} times to the candidate (watch_without_traffic: "
                        "load)")  # fmt: skip
    log.info("%s", report.notes[-1])
    load = WatchLoad(url=candidate.url, audience=candidate.service_url, served_name=delivery.served_name,
                     requests=delivery.watch.min_requests)  # fmt: skip
    return delivery.canary, replace(run, load=load)


def watch_promoted(report: PromotionReport, run: DeliveryRun, *, previous_url: str | None) -> None:
    """The watch at 100 %; then the previous revision's tag goes, or traffic goes back.

    ``previous_url``: the tag URL of the revision that served before, when it kept its ``previous`` tag for this
    watch (it is kept warm there, and untagged once the watch is over); None when no revision holds that tag (a
    replace rollout has no GPU to keep one warm on)."""
    alone = [(run.candidate.revision, 100)]
    if run.samples > 0:
        with report.step("watch"):
            keep_warm = (previous_url, run.candidate.service_url) if previous_url else None
            result = _watch(run, "watch 100 %", alone, keep_warm)
            report.delivery.append(result)
            if result.breached:
                _roll_back(run, result, alone)
    if previous_url is not None:
        run.fenced(alone, "release the previous revision")
        run_release_previous(run.target, run.service_id, run.candidate)


def _watch(
    run: DeliveryRun, step: str, split: list[tuple[str, int]], keep_warm: tuple[str, str] | None = None
) -> StepResult:
    """One step's watch (its own task run, given data only: the lock stays here); when it cannot judge (the metrics
    unreadable past their retries), traffic goes back as on a breach: a run that failed leaves traffic where it was."""
    candidate = run.candidate
    try:
        return monitoring_watch_revision(run.target, run.service_id, candidate.revision, run.delivery.watch,
                                         run.samples, step, split, keep_warm, run.delivery.vllm_metrics,
                                         run.load)  # fmt: skip
    except Exception as exc:
        if not candidate.previous_traffic:
            raise
        run.fenced(split, f"{step}: roll back")
        run_abandon_candidate(run.target, run.service_id, candidate, "rolled-back")
        raise InfraError(
            f"{step}: the watch could not judge the candidate ({exc}); traffic is back on "
            f"{describe_split(candidate.previous_traffic)}"
        ) from exc


def _roll_back(run: DeliveryRun, result: StepResult, split: list[tuple[str, int]]) -> None:
    """Traffic back to where it was before the run (from ``split``), then the run fails saying what was seen."""
    candidate = run.candidate
    if not candidate.previous_traffic:
        raise WatchBreached(
            f"{result.step} breached the SLO: {result.reason}. Nothing served before this run, so {candidate.revision} "
            "still serves: fix the model and promote again, or remove the service with teardown"
        )
    run.fenced(split, f"{result.step}: roll back")
    run_abandon_candidate(run.target, run.service_id, candidate, "rolled-back")
    raise RolledBack(
        f"{result.step} breached the SLO: {result.reason}; traffic is back on "
        f"{describe_split(candidate.previous_traffic)}"
    )
