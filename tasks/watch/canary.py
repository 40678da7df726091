"""Progressive delivery: traffic moves in steps, each step judged on the service's own Cloud Monitoring metrics, and
a step that breaches the SLO sends traffic back to the revision that served before.

Cloud Deploy's canary strategy for Cloud Run, Argo Rollouts and Flagger work this way. Here a step is judged on the
candidate revision's ``request_count`` (5xx ratio) and ``request_latencies`` (p95) as Cloud Run reports them
(tasks/watch/monitoring.py), and on the 429s Cloud Run answered for it with every instance busy, from its request log
(tasks/watch/request_log.py): a candidate too slow for its traffic throttles its users, which is its failure. Cloud
Run samples the metrics every ``metrics_sample_seconds`` and shows a sample up to ``metrics_delay_seconds`` later
(both on the target), so a step ends when its window has passed and every sample of it can be seen; a breach ends it
at once.

During the post-promotion watch the previous revision keeps a ``previous`` tag, so it stays addressable at its own
URL, and is sent a /health request at every read: that is what keeps it warm (an idle instance stays up for a while
after a request), so moving traffic back is instant rather than a cold start. The tag itself keeps nothing: the
service-level minimum the pipeline sets counts only revisions in the traffic split ("a tagged revision outside the
split is not counted toward it", Cloud Run docs, "Set minimum instances for services"), and templates carry no
revision-level minimum, which would hold a tagged revision's GPUs at 0 % past every scale-down.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import httpx
from prefect import task
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.logs import run_logger
from tasks.common.permissions import METRIC_WRITER_ROLE
from tasks.deploy.metrics_sidecar import SCRAPE_PORT
from tasks.deploy.probe import VerificationFailed, VerifyOptions, chat_completion
from tasks.deploy.traffic import describe_split
from tasks.watch.monitoring import RevisionTraffic, list_series, revision_traffic
from tasks.watch.request_log import throttled_requests
from tasks.watch.vllm_metrics import TTFT, VllmSignals, revision_filter, revision_signals

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
        0.01,
        ge=0,
        le=1,
        description="Largest share of the candidate's requests that may fail (0.01 = 1 %, Flagger's default success "
        "rate of 99 %): 5xx, the 429s Cloud Run answers when every instance is busy (too slow for its traffic), and "
        "with metrics: vllm also streams that failed after their 200.",
    )
    max_ttft_p95_ms: float | None = Field(
        None,
        gt=0,
        description="Largest p95 time to first token, ms, from vLLM's metrics (needs metrics: vllm). Empty: 2,000 ms, "
        "MLPerf Inference's limit for conversational LLM serving (Llama 2 70B and Llama 3.1 8B servers, TTFT 2 s).",
    )
    max_tpot_p95_ms: float | None = Field(
        None,
        gt=0,
        description="Largest p95 time per output token, ms, from vLLM's metrics (needs metrics: vllm). Empty: 100 ms, "
        "MLPerf Inference's Llama 3.1 8B server limit: 10 tokens/s, faster than people read.",
    )
    max_p95_ms: float | Literal["off"] | None = Field(
        None,
        description="Largest p95 request latency, ms, as Cloud Run measures it (a whole completion: it follows "
        'max_tokens and answer length); "off" does not judge it. Empty: 60,000 ms when the watch has only Cloud '
        "Run's request metrics; not judged when it has vLLM's TTFT and TPOT. 0 is refused: it could mean either.",
    )
    min_requests: int = Field(
        10, ge=1, description="Requests a step needs before its ratio and p95 are judged; fewer are reported as such."
    )

    @field_validator("max_p95_ms", mode="before")
    @classmethod
    def _p95_limit_or_off(cls, value: object) -> object:
        """A limit, "off", or empty (None) for the default. Empty once meant "not judged", which "off" says now; what
        could be read as a limit or as off (0, false, another word) is refused rather than guessed. Empty stays
        accepted: Prefect sends a WatchOptions whose field was never set as null, and the run must take it back."""
        if value is None or value == "off":
            return value
        limit = None if isinstance(value, bool) else _number(value)
        if limit == 0:
            raise ValueError(f"0 could mean off (as watch.samples: 0 does) or a limit every request breaches; "
                             f"{P95_CHOICES}")  # fmt: skip
        if limit is None or not limit > 0:  # not a number, negative, or NaN
            raise ValueError(f"{value!r} is neither a limit in ms nor off; {P95_CHOICES}")
        return limit

    def refuse_without_vllm_metrics(self, metrics: str) -> None:
        """TTFT and TPOT come from vLLM's metrics: without the sidecar there is nothing to judge them on."""
        for name in ("max_ttft_p95_ms", "max_tpot_p95_ms"):
            if getattr(self, name) is not None and metrics != "vllm":
                raise ValueError(
                    f"watch.{name}: judged on vLLM's own metrics, which only the Prometheus sidecar collects; set "
                    f"metrics: vllm (the profile's, or the model file's), or remove watch.{name}"
                )

    def slo(self, vllm: bool) -> Slo:
        """The limits in force: the cited defaults for what was left empty; None for a latency not judged."""
        if self.max_p95_ms == "off":
            p95 = None
        elif vllm:  # TTFT and TPOT judge latency: a whole request's p95 only when asked for
            p95 = self.max_p95_ms
        else:
            p95 = self.max_p95_ms or DEFAULT_P95_MS
        if vllm:
            return Slo(self.max_error_ratio, self.max_ttft_p95_ms or DEFAULT_TTFT_P95_MS,
                       self.max_tpot_p95_ms or DEFAULT_TPOT_P95_MS, p95)  # fmt: skip
        return Slo(self.max_error_ratio, None, None, p95)


def _number(value: object) -> float | None:
    """``value`` as a number (a number, or a string of one), else None."""
    if not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


# MLPerf Inference's LLM server limits (mlcommons/inference_policies inference_rules.adoc, "Conversational category:
# TTFT/TPOT: 2000 ms/100 ms" for Llama3.1-8B; mlcommons/inference loadgen/mlperf.conf llama3_1-8b.Server.ttft_latency
# = 2000, tpot_latency = 100). MLPerf judges them at p99; a canary's few requests are judged at p95, more leniently.
# TPOT is a per-request mean there as in vLLM's request_time_per_output_token_seconds.
DEFAULT_TTFT_P95_MS = 2_000.0
DEFAULT_TPOT_P95_MS = 100.0
DEFAULT_P95_MS = 60_000.0
P95_CHOICES = (
    'give the largest request p95 in ms (e.g. 30000), "off" not to judge it, or leave it empty for the default '
    "(60,000 ms when the watch has only Cloud Run's request metrics; not judged when it has vLLM's TTFT and TPOT)"
)


@dataclass(frozen=True)
class Slo:
    max_error_ratio: float
    max_ttft_p95_ms: float | None
    max_tpot_p95_ms: float | None
    max_p95_ms: float | None


class StepResult(BaseModel):
    """One traffic step as the report shows it."""

    step: str
    split: str
    requests: int
    errors: int
    error_ratio: float | None
    throttled: int = 0  # 429s Cloud Run answered for the candidate (every instance busy); in requests and the ratio
    p95_ms: float | None
    stream_errors: int | None = None  # None: judged without vLLM's metrics
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    verdict: Verdict
    reason: str
    seconds: float

    @property
    def breached(self) -> bool:
        return self.verdict == "breached"


class WatchLoad(BaseModel):
    """The verify step's own request, sent to the candidate at each step when the service has too little traffic of
    its own for the watch to judge (the profile's watch_without_traffic: load)."""

    url: str = Field(description="Where the candidate answers at this step: its tag URL, or the service URL at 100 %.")
    audience: str = Field(description="The service URL: the ID token's audience (Cloud Run refuses a tag URL).")
    served_name: str
    requests: int


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


@dataclass(frozen=True)
class Limits:
    """How many requests the candidate's revision takes at once on Cloud Run: instances x requests each."""

    max_instances: int | None  # None: the revision sets none, so Cloud Run's default (from the region's quotas)
    concurrency: int


def judge(
    seen: RevisionTraffic, watch: WatchOptions, vllm: VllmSignals | None = None, limits: Limits | None = None
) -> tuple[Verdict, str]:
    """The verdict on what the candidate served so far, and the figures that decided it. With ``vllm`` (the sidecar
    runs), failures include streams that failed after their 200, and TTFT and TPOT are judged; until vLLM's metrics
    of the step have arrived, latency is judged on Cloud Run's request metrics as without the sidecar.

    Requests are the more of Cloud Run's count and vLLM's finished requests: vLLM's reach Monitoring within a scrape,
    Cloud Run's up to 180 s later, and a ratio of one to the other would run past 100 %. The 429s Cloud Run answered
    for the candidate (every instance busy: ``seen.throttled``) are its failures too: its users were refused because
    it could not keep up, not for anything they did; they count against max_error_ratio like 5xx, and a breach they
    are part of says so, with the candidate's ``limits``."""
    judged_on_vllm = vllm is not None and vllm.ttft.count > 0
    slo = watch.slo(judged_on_vllm)
    requests = (max(seen.requests, vllm.finished_total) if vllm is not None else seen.requests) + seen.throttled
    failed = seen.errors + seen.throttled + (vllm.stream_errors if vllm is not None else 0)
    figures = f"{requests} requests, {seen.errors} 5xx"
    if seen.throttled:
        figures += f", {seen.throttled} 429"
    if vllm is not None:
        figures += f", {vllm.stream_errors} stream errors"
        for label, value in (("TTFT p95", vllm.ttft_p95_ms), ("TPOT p95", vllm.tpot_p95_ms)):
            figures += f", {label} {value:,.0f} ms" if value is not None else ""
    if seen.p95_ms is not None:
        figures += f", request p95 {seen.p95_ms:,.0f} ms"
    if requests < watch.min_requests:
        return "too little traffic", f"{figures}: fewer than min_requests ({watch.min_requests}), not judged"
    ratio = min(failed / requests, 1.0)
    if ratio > slo.max_error_ratio:
        parts = [f"{seen.errors} 5xx"] + ([f"{seen.throttled} 429"] if seen.throttled else [])
        parts += [f"{vllm.stream_errors} stream errors"] if vllm is not None else []
        what = "5xx ratio" if len(parts) == 1 else f"error ratio ({' + '.join(parts)})"
        reason = f"{figures}: {what} {ratio:.1%} above max_error_ratio {slo.max_error_ratio:.1%}"
        return "breached", reason + (throttled_reason(limits) if seen.throttled else "")
    if judged_on_vllm:
        assert vllm is not None
        for label, value, limit, name in (
            ("TTFT p95", vllm.ttft_p95_ms, slo.max_ttft_p95_ms, "max_ttft_p95_ms"),
            ("TPOT p95", vllm.tpot_p95_ms, slo.max_tpot_p95_ms, "max_tpot_p95_ms"),
        ):
            if value is not None and limit is not None and value > limit:
                return "breached", f"{figures}: {label} {value:,.0f} ms above {name} {limit:,.0f} ms"
    if slo.max_p95_ms is not None and seen.p95_ms is not None and seen.p95_ms > slo.max_p95_ms:
        return "breached", f"{figures}: request p95 {seen.p95_ms:,.0f} ms above max_p95_ms {slo.max_p95_ms:,.0f} ms"
    return "held", f"{figures}: within the SLO"


def throttled_reason(limits: Limits | None) -> str:
    """What the 429s in a breach mean, in the words the report and the run's failure carry."""
    if limits is None:
        return "; 429: the candidate could not keep up with its traffic, and Cloud Run refused the rest"
    most = limits.max_instances if limits.max_instances is not None else "(Cloud Run's default)"
    return (
        f"; 429: the candidate could not keep up with its traffic at max instances {most} "
        f"({limits.concurrency} requests each): Cloud Run refused what found every instance busy; make it faster, "
        "or raise max_instances or concurrency"
    )


def revision_limits(target: GcpTarget, service_id: str, revision: str) -> Limits | None:
    """The revision's max instances and concurrency as Cloud Run has them; None if it cannot be read (the verdict
    then names the 429s without them)."""
    name = f"{target.location_path}/services/{service_id}/revisions/{revision}"
    try:
        found = clients.run_revisions(target).get_revision(name=name)
    except Exception as exc:  # the figures are a courtesy: the verdict stands without them
        run_logger().warning("could not read %s's max instances and concurrency (%s)", revision, exc)
        return None
    return Limits(found.scaling.max_instance_count or None, found.max_instance_request_concurrency)


def watch_step(
    target: GcpTarget,
    service_id: str,
    revision: str,
    watch: WatchOptions,
    samples: int,
    step: str,
    split: list[tuple[str, int]],
    keep_warm: tuple[str, str] | None = None,
    vllm: bool = False,
    load: WatchLoad | None = None,
) -> StepResult:
    """Watch ``revision`` for ``samples`` sampling periods from now; a breach ends the watch at once. With ``vllm``
    (the Prometheus sidecar runs beside it), also on vLLM's TTFT, TPOT and the streams that failed after their 200.

    The step is whole when its window has passed and either a sample ending after the window has been seen or the
    longest visibility delay has passed too. ``keep_warm`` (the previous revision's tag URL and its service URL, the
    token audience) is sent /health at every read, so the way back stays instant."""
    log = run_logger()
    token = clients.identity_token(target, keep_warm[1]) if keep_warm else None
    period = target.metrics_sample_seconds
    window = samples * period
    began = datetime.now(UTC)
    started = time.monotonic()
    latest = began + timedelta(seconds=window + target.metrics_delay_seconds)
    log.info(
        "%s: judging %s over %d sampling periods of %g s (%g s); Cloud Monitoring shows a period up to %g s "
        "after it ends, so the step ends by %s UTC at the latest, at once on a breach",
        step, revision, samples, period, window, target.metrics_delay_seconds, f"{latest:%H:%M:%S}",
    )  # fmt: skip
    if load is not None:
        answered = send_load(target, load)
        log.info("%s: sent %d chat completions to %s (%d answered 200) for the watch to judge", step,
                 load.requests, revision, answered)  # fmt: skip
    limits: Limits | None = None
    while True:
        now = datetime.now(UTC)
        seen = revision_traffic(target, service_id, revision, began, now)
        seen.throttled = throttled_requests(target, service_id, revision, began, now)
        signals = revision_signals(target, service_id, revision, began, now) if vllm else None
        if seen.throttled and limits is None:
            limits = revision_limits(target, service_id, revision)
        verdict, reason = judge(seen, watch, signals, limits)
        elapsed = time.monotonic() - started
        window_seen = seen.newest_sample_end is not None and (seen.newest_sample_end - began).total_seconds() >= window
        whole = elapsed >= window and (window_seen or elapsed >= window + target.metrics_delay_seconds)
        if verdict == "breached" or whole:
            break
        if elapsed < window:
            log.info("%s: %s (%.1f s of the %g s window)", step, reason, elapsed, window)
        else:
            left = window + target.metrics_delay_seconds - elapsed
            log.info("%s: %s; the window is over, waiting up to %.1f s more for Monitoring's last period",
                     step, reason, max(left, 0))  # fmt: skip
        if keep_warm is not None and token is not None:
            _touch(keep_warm[0], token)
        time.sleep(period)
    result = StepResult(
        step=step, split=describe_split(split), requests=seen.offered, errors=seen.errors, throttled=seen.throttled,
        error_ratio=seen.error_ratio, p95_ms=seen.p95_ms, verdict=verdict, reason=reason,
        seconds=round(time.monotonic() - started, 2),
    )  # fmt: skip
    if signals is not None:
        result.stream_errors = signals.stream_errors
        result.ttft_p95_ms, result.tpot_p95_ms = signals.ttft_p95_ms, signals.tpot_p95_ms
    (log.warning if result.breached else log.info)("%s: %s: %s", step, verdict, reason)
    return result


def send_load(target: GcpTarget, load: WatchLoad) -> int:
    """The verify step's chat completion, ``load.requests`` times, one after another; how many answered 200. A
    failure is not raised: the watch judges it from Cloud Run's own count of the candidate's 5xx."""
    token = clients.identity_token(target, load.audience)
    options = VerifyOptions()
    answered = 0
    with httpx.Client(base_url=load.url, headers={"Authorization": f"Bearer {token.get_secret_value()}"},
                      timeout=options.request_timeout_s) as client:  # fmt: skip
        for _ in range(load.requests):
            with contextlib.suppress(httpx.HTTPError, VerificationFailed):
                chat_completion(client, load.served_name, options)
                answered += 1
    return answered


def served_requests(target: GcpTarget, service_id: str, split: list[tuple[str, int]], seconds: float) -> int | None:
    """Requests the revisions of ``split`` served in the last ``seconds`` as Cloud Monitoring has seen them; None when
    the metrics cannot be read (the watch then runs as configured and says what it saw)."""
    now = datetime.now(UTC)
    try:
        return sum(revision_traffic(target, service_id, revision, now - timedelta(seconds=seconds), now).requests
                   for revision, _ in split)  # fmt: skip
    except Exception as exc:  # read again by the watch itself, which fails the run if it still cannot
        run_logger().warning("could not read what %s served lately (%s); watching as configured", service_id, exc)
        return None


def _touch(url: str, token: SecretStr) -> None:
    """One /health request to the previous revision's tag URL; its answer is not the watch's business."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token.get_secret_value()}"}, timeout=10)


def read_revision(target: GcpTarget, service_id: str, revision: str, vllm: bool = False) -> RevisionTraffic:
    """The revision's metrics of the last sampling periods, and its 429s in its request log: proves the watch can read
    both (permissions, APIs) before traffic moves.

    With ``vllm``, also that the sidecar writes vLLM's metrics for it: its start-up scrape comes 10 s after it
    starts, so this waits up to two sampling periods and the longest delay for the first series, then says why none
    came (the serving account's metricWriter role, or vLLM not on the scraped port)."""
    now = datetime.now(UTC)
    since = now - timedelta(seconds=target.metrics_delay_seconds)
    seen = revision_traffic(target, service_id, revision, since, now)
    seen.throttled = throttled_requests(target, service_id, revision, since, now)
    if not vllm:
        return seen
    deadline = time.monotonic() + 2 * target.metrics_sample_seconds + target.metrics_delay_seconds
    while True:
        now = datetime.now(UTC)
        first_series = revision_filter(TTFT, "histogram", target, service_id, revision)
        if list_series(target, first_series, now - timedelta(hours=1), now):
            return seen
        if time.monotonic() >= deadline:
            raise NoVllmMetrics(
                f"no vLLM metrics for {revision} in Cloud Monitoring: the Prometheus sidecar writes them as the "
                f"serving account, which needs {METRIC_WRITER_ROLE} (`gcloud projects add-iam-policy-binding "
                f"{target.project} "
                f"--member=serviceAccount:{target.service_account_email} --role={METRIC_WRITER_ROLE}`), and scrapes "
                f"port {SCRAPE_PORT} only (container_port); the candidate's log in the Cloud Run console says which"
            )
        time.sleep(target.metrics_sample_seconds / 4)


class NoVllmMetrics(RuntimeError):
    """The sidecar wrote nothing for the candidate: the watch could not judge it on vLLM's metrics."""


monitoring_watch_revision = task(name="monitoring_watch_revision")(watch_step)
monitoring_read_revision = task(name="monitoring_read_revision")(read_revision)
monitoring_read_served_requests = task(name="monitoring_read_served_requests")(served_requests)
