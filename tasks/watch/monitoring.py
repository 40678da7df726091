"""What a Cloud Run revision served, read from Cloud Monitoring's Cloud Run metrics.

``run.googleapis.com/request_count`` (DELTA, INT64, by ``response_code_class``) and
``run.googleapis.com/request_latencies`` (DELTA, DISTRIBUTION, ms) of resource ``cloud_run_revision`` (Google Cloud
metrics, "run"). Neither counts the 429s Cloud Run answers itself when every instance is busy: those come from the
revision's request log (request_log.py). Cloud Run samples them every 60 s, and a sample is not visible for up to
180 s after: a reader must wait for the data of a period before it knows that period was quiet (``visible_until``).

The raw points are read (``ALIGN_NONE``) and summed here, not aligned by the API: an aligned point covers the
alignment period that ends at the interval's end (at least 60 s), which reaches back before a traffic step that
began less than a period ago, into traffic the step is not to be judged on. Raw DELTA points are whole sampling
periods; a point is counted when its period ends after the step began.

The Monitoring API is called over REST through an authorized session: google-cloud-monitoring ships gRPC
transports only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from google.api_core import exceptions as gexc

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import gcp_errors, with_retry

REQUEST_COUNT = "run.googleapis.com/request_count"
REQUEST_LATENCIES = "run.googleapis.com/request_latencies"
MONITORING_VIEWER_ROLE = "roles/monitoring.viewer"
MAX_PAGES = 50  # a step's raw points for one revision fit in one page; never loop forever on a bad token


@dataclass
class LatencyHistogram:
    """Merged request latency distribution: bucket ``[lower, upper)`` in ms -> requests."""

    buckets: dict[tuple[float, float], int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def add(self, lower: float, upper: float, count: int) -> None:
        if count:
            self.buckets[(lower, upper)] = self.buckets.get((lower, upper), 0) + count

    def percentile(self, q: float) -> float | None:
        """The ``q`` quantile (0-1) in ms, interpolated within its bucket as Cloud Monitoring's percentile
        aligners do; the overflow bucket answers its lower bound (the value is at least that). None when empty."""
        total = self.count
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for (lower, upper), count in sorted(self.buckets.items()):
            if seen + count >= rank:
                if math.isinf(upper):
                    return lower
                lower = max(lower, 0.0)
                return lower + (upper - lower) * ((rank - seen) / count)
            seen += count
        return None


@dataclass
class RevisionTraffic:
    """What one revision served in an interval, as Cloud Monitoring has seen it so far: requests, by
    response_code_class ("5xx"), their latencies, and the end of the newest sampling period seen; and the requests
    Cloud Run refused it with 429 (``throttled``, from its request log: tasks/watch/request_log.py)."""

    requests: int = 0
    by_class: dict[str, int] = field(default_factory=dict)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    newest_sample_end: datetime | None = None
    throttled: int = 0
    """Requests Cloud Run answered 429 with every instance busy: not in ``requests`` (request_count leaves out what
    never reached the container)."""

    @property
    def errors(self) -> int:
        """Server errors (5xx): what the candidate did wrong. Other 4xx are the callers' mistakes; a 429 over
        capacity is the candidate's too (too slow for its traffic), counted apart as ``throttled``."""
        return self.by_class.get("5xx", 0)

    @property
    def offered(self) -> int:
        """Every request sent to the revision: those that reached it and those Cloud Run refused for it."""
        return self.requests + self.throttled

    @property
    def error_ratio(self) -> float | None:
        """The share of its requests that failed for the revision's sake: 5xx and 429s."""
        return (self.errors + self.throttled) / self.offered if self.offered else None

    @property
    def p95_ms(self) -> float | None:
        return self.latency.percentile(0.95)


def revision_filter(metric: str, target: GcpTarget, service_id: str, revision: str) -> str:
    """The monitoring filter for one metric of one revision of ``service_id`` in the target's region."""
    return " AND ".join(
        [
            f'metric.type = "{metric}"',
            'resource.type = "cloud_run_revision"',
            f'resource.labels.service_name = "{service_id}"',
            f'resource.labels.revision_name = "{revision}"',
            f'resource.labels.location = "{target.region}"',
        ]
    )


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as Google's JSON gives it (``Z``, up to nanoseconds)."""
    text = text.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:  # Python parses at most microseconds
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        text = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    return datetime.fromisoformat(text)


def list_series(target: GcpTarget, metric_filter: str, start: datetime, end: datetime) -> list[dict]:
    """All raw time series matching ``metric_filter`` with points in ``(start, end]``."""
    rest = clients.monitoring(target)
    params = {
        "filter": metric_filter,
        "interval.startTime": rfc3339(start),
        "interval.endTime": rfc3339(end),
        "view": "FULL",
    }

    def page(token: str) -> dict:
        response = rest.session.get(
            rest.url(f"projects/{target.project}/timeSeries"),
            params={**params, "pageToken": token} if token else params,
            timeout=60,
        )
        if response.status_code >= 400:
            raise gexc.from_http_response(response)
        return response.json() if response.content else {}

    series: list[dict] = []
    with gcp_errors("monitoring", MONITORING_VIEWER_ROLE, "reading Cloud Run metrics", target):
        token = ""
        for _ in range(MAX_PAGES):
            answer = with_retry(lambda token=token: page(token))
            series += answer.get("timeSeries", [])
            token = answer.get("nextPageToken", "")
            if not token:
                break
    return series


def revision_traffic(
    target: GcpTarget, service_id: str, revision: str, since: datetime, until: datetime
) -> RevisionTraffic:
    """Requests, their response classes and latencies of ``revision`` in sampling periods ending after ``since``."""
    seen = RevisionTraffic()
    for series in list_series(target, revision_filter(REQUEST_COUNT, target, service_id, revision), since, until):
        code_class = series.get("metric", {}).get("labels", {}).get("response_code_class", "unknown")
        for point in _points_after(series, since, seen):
            count = int(point["value"].get("int64Value", 0))
            seen.requests += count
            seen.by_class[code_class] = seen.by_class.get(code_class, 0) + count
    for series in list_series(target, revision_filter(REQUEST_LATENCIES, target, service_id, revision), since, until):
        for point in _points_after(series, since, seen):
            add_distribution(seen.latency, point["value"].get("distributionValue", {}))
    return seen


def _points_after(series: dict, since: datetime, seen: RevisionTraffic) -> list[dict]:
    points = []
    for point in series.get("points", []):
        end = parse_time(point["interval"]["endTime"])
        if end > since:
            points.append(point)
            if seen.newest_sample_end is None or end > seen.newest_sample_end:
                seen.newest_sample_end = end
    return points


def bucket_bounds(options: dict, buckets: int) -> list[tuple[float, float]]:
    """``[lower, upper)`` of each bucket of a Distribution: underflow first, overflow last (Monitoring API v3
    ``BucketOptions``: linear, exponential or explicit)."""
    if "linearBuckets" in options:
        spec = options["linearBuckets"]
        n, width, offset = int(spec["numFiniteBuckets"]), float(spec["width"]), float(spec.get("offset", 0))
        edges = [offset + width * i for i in range(n + 1)]
    elif "exponentialBuckets" in options:
        spec = options["exponentialBuckets"]
        n, factor, scale = int(spec["numFiniteBuckets"]), float(spec["growthFactor"]), float(spec["scale"])
        edges = [scale * factor**i for i in range(n + 1)]
    elif "explicitBuckets" in options:
        edges = [float(b) for b in options["explicitBuckets"].get("bounds", [])]
    else:
        edges = []
    bounds = [(-math.inf, edges[0])] if edges else []
    bounds += list(itertools.pairwise(edges))
    bounds.append((edges[-1] if edges else -math.inf, math.inf))
    return bounds[:buckets] if buckets else bounds


def add_distribution(histogram: LatencyHistogram, value: dict, scale: float = 1.0, less: dict | None = None) -> None:
    """Add one Distribution value's bucket counts (trailing empty buckets may be omitted, as the API does), bounds
    times ``scale`` (1000: seconds to ms), less the counts of the earlier cumulative value ``less``."""
    counts = [int(c) for c in value.get("bucketCounts", [])]
    if not counts:  # no buckets: all requests at the mean
        mean = float(value.get("mean", 0)) * scale
        before = int(less.get("count", 0)) if less else 0
        histogram.add(mean, mean, int(value.get("count", 0)) - before)
        return
    before = [int(c) for c in (less or {}).get("bucketCounts", [])]
    counts = [c - (before[i] if i < len(before) else 0) for i, c in enumerate(counts)]
    for (lower, upper), count in zip(bucket_bounds(value.get("bucketOptions", {}), len(counts)), counts, strict=False):
        histogram.add(lower * scale, upper * scale, max(count, 0))
