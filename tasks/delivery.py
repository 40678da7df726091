"""Progressive delivery: traffic moves in steps, each step judged on the service's own Cloud Monitoring metrics, and
a step that breaches the SLO sends traffic back to the revision that served before.

Cloud Deploy's canary strategy for Cloud Run, Argo Rollouts and Flagger work this way. Here a step is judged on the
candidate revision's ``request_count`` (5xx ratio) and ``request_latencies`` (p95) as Cloud Run reports them
(tasks/monitoring.py). Cloud Run samples them every ``metrics_sample_seconds`` and shows a sample up to
``metrics_delay_seconds`` later (both on the target), so a step ends when its window has passed and every sample
of it can be seen; a breach ends it at once.

During the post-promotion watch the previous revision keeps a ``previous`` tag (so it stays addressable: Cloud Run
keeps a tagged revision's minimum instances) and is sent a /health request at every read (an idle instance stays up
for a while after a request), so moving traffic back is instant rather than a cold start.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Literal

import httpx
from prefect import task
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from blocks.target import GcpTarget
from tasks import clients
from tasks.logs import run_logger
from tasks.monitoring import RevisionTraffic, revision_traffic

PREVIOUS_TAG = "previous"
Verdict = Literal["held", "breached", "too little traffic"]


class WatchOptions(BaseModel):
    """How a promotion is watched after each traffic move, and the SLO it is judged on."""

    model_config = ConfigDict(extra="forbid")

    samples: int | None = Field(
        None,
        ge=0,
        le=1440,
        description="Sampling periods of Cloud Monitoring to watch each traffic step for (Cloud Run samples every "
        "60 s: 10 is 10 minutes); the profile's watch_samples when empty; 0 turns the watch off.",
    )
    max_error_ratio: float = Field(
        0.02, ge=0, le=1, description="Largest share of the candidate's requests that may answer 5xx (0.02 = 2 %)."
    )
    max_p95_ms: float | None = Field(
        60_000,
        gt=0,
        description="Largest p95 request latency of the candidate, ms, as Cloud Run measures it (a whole non-streamed "
        "completion; set it for your model's max_tokens); empty: latency is reported, not judged.",
    )
    min_requests: int = Field(
        10, ge=1, description="Requests a step needs before its ratio and p95 are judged; fewer are reported as such."
    )


class StepResult(BaseModel):
    """One traffic step as the report shows it."""

    step: str
    split: str
    requests: int
    errors: int
    error_ratio: float | None
    p95_ms: float | None
    verdict: Verdict
    reason: str
    seconds: float

    @property
    def breached(self) -> bool:
        return self.verdict == "breached"


class RolledBack(RuntimeError):
    """A step breached the SLO and traffic went back to the previous revision; the message says what was seen."""


class WatchBreached(RuntimeError):
    """A first deploy breached the SLO: there is no previous revision to go back to, so it still serves."""


def check_canary(steps: list[int] | None, field: str = "canary") -> list[int]:
    """Canary percentages: whole numbers from 1 to 99, rising; the final 100 % is the promotion itself."""
    steps = list(steps or [])
    for i, percent in enumerate(steps):
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 99:
            raise ValueError(
                f"{field}[{i}]: {percent!r} is not a whole percentage from 1 to 99; give the candidate's share of "
                "traffic at each step, e.g. canary: [10, 50] (the last step to 100 % is the promotion)"
            )
        if i and percent <= steps[i - 1]:
            raise ValueError(
                f"{field}[{i}]: {percent} does not rise above the step before ({steps[i - 1]}); list the steps in "
                "rising order, e.g. [10, 50]"
            )
    if len(steps) > 10:
        raise ValueError(f"{field}: {len(steps)} steps; give at most 10")
    return steps


def rescaled(traffic: list[tuple[str, int]], total: int = 100) -> list[tuple[str, int]]:
    """``traffic`` scaled to add up to ``total`` in its own proportions (the largest remainders get the rounding, so
    the sum is exact as Cloud Run requires); a revision whose share rounds to 0 drops out."""
    whole = sum(p for _, p in traffic) or 1
    exact = [(revision, p * total / whole) for revision, p in traffic]
    shares = {revision: int(share) for revision, share in exact}
    left = total - sum(shares.values())
    for revision, _ in sorted(exact, key=lambda item: item[1] - int(item[1]), reverse=True)[:left]:
        shares[revision] += 1
    return [(revision, shares[revision]) for revision, _ in traffic if shares[revision]]


def canary_split(previous: list[tuple[str, int]], candidate: str, percent: int) -> list[tuple[str, int]]:
    """The candidate at ``percent``, the revisions that served before sharing the rest in their old proportions."""
    return [(candidate, percent), *rescaled(previous, 100 - percent)]


def describe_split(split: list[tuple[str, int]]) -> str:
    return " / ".join(f"{revision} {percent} %" for revision, percent in split)


def judge(seen: RevisionTraffic, watch: WatchOptions) -> tuple[Verdict, str]:
    """The verdict on what the candidate served so far, and the figures that decided it."""
    figures = f"{seen.requests} requests, {seen.errors} 5xx"
    if seen.p95_ms is not None:
        figures += f", p95 {seen.p95_ms:,.0f} ms"
    if seen.requests < watch.min_requests:
        return "too little traffic", f"{figures}: fewer than min_requests ({watch.min_requests}), not judged"
    ratio = seen.error_ratio or 0.0
    if ratio > watch.max_error_ratio:
        return "breached", f"{figures}: 5xx ratio {ratio:.1%} above max_error_ratio {watch.max_error_ratio:.1%}"
    if watch.max_p95_ms is not None and seen.p95_ms is not None and seen.p95_ms > watch.max_p95_ms:
        return "breached", f"{figures}: p95 {seen.p95_ms:,.0f} ms above max_p95_ms {watch.max_p95_ms:,.0f} ms"
    return "held", f"{figures}: within the SLO"


def watch_step(
    target: GcpTarget,
    service_id: str,
    revision: str,
    watch: WatchOptions,
    samples: int,
    step: str,
    split: list[tuple[str, int]],
    keep_warm: tuple[str, str] | None = None,
) -> StepResult:
    """Watch ``revision`` for ``samples`` sampling periods from now; a breach ends the watch at once.

    The step is whole when its window has passed and either a sample ending after the window has been seen or the
    longest visibility delay has passed too. ``keep_warm`` (the previous revision's tag URL and its service URL, the
    token audience) is sent /health at every read, so the way back stays instant."""
    log = run_logger()
    token = clients.identity_token(target, keep_warm[1]) if keep_warm else None
    period = target.metrics_sample_seconds
    window = samples * period
    began = datetime.now(UTC)
    started = time.monotonic()
    while True:
        seen = revision_traffic(target, service_id, revision, began, datetime.now(UTC))
        verdict, reason = judge(seen, watch)
        elapsed = time.monotonic() - started
        window_seen = seen.newest_sample_end is not None and (seen.newest_sample_end - began).total_seconds() >= window
        whole = elapsed >= window and (window_seen or elapsed >= window + target.metrics_delay_seconds)
        if verdict == "breached" or whole:
            break
        log.info("%s: %s after %.0f s of %.0f s", step, reason, elapsed, window)
        if keep_warm is not None and token is not None:
            _touch(keep_warm[0], token)
        time.sleep(period)
    result = StepResult(
        step=step, split=describe_split(split), requests=seen.requests, errors=seen.errors,
        error_ratio=seen.error_ratio, p95_ms=seen.p95_ms, verdict=verdict, reason=reason,
        seconds=round(time.monotonic() - started, 2),
    )  # fmt: skip
    (log.warning if result.breached else log.info)("%s: %s: %s", step, verdict, reason)
    return result


def _touch(url: str, token: SecretStr) -> None:
    """One /health request to the previous revision's tag URL; its answer is not the watch's business."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token.get_secret_value()}"}, timeout=10)


def read_revision(target: GcpTarget, service_id: str, revision: str) -> RevisionTraffic:
    """The revision's metrics of the last sampling periods: proves the watch can read them (permission, API)."""
    now = datetime.now(UTC)
    return revision_traffic(target, service_id, revision, now - timedelta(seconds=target.metrics_delay_seconds), now)


monitoring_watch_revision = task(name="monitoring_watch_revision")(watch_step)
monitoring_read_revision = task(name="monitoring_read_revision")(read_revision)
