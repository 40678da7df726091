"""The Cloud Run metrics the Monitoring stand-in serves: descriptors, distributions, and RFC 3339 time.

Names, kinds, value types, units and labels are those of Google's metrics list for run.googleapis.com
(https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-run, as reproduced by monitoring integrations:
elastic/integrations packages/gcp/docs/cloudrun.md, observeinc's GCP Cloud Run metrics page):
- ``request_count``: DELTA INT64 "1", "Number of requests reaching the revision. Excludes requests that are not
  reaching your container instances (e.g. unauthorized requests or when maximum number of instances is reached).
  Captured at the end of the request lifecycle." Labels ``response_code``, ``response_code_class`` (dashboards group
  by ``metric.labels.response_code_class``: GoogleCloudPlatform/monitoring-dashboard-samples) and ``route_type``
  (listed on Google's page as we remember it; not confirmed from a public copy, always "default" here).
- ``request_latencies``: DELTA DISTRIBUTION "ms", "Distribution of request latency in milliseconds reaching the
  revision. Latency is measured from when the request reaches the running container to when it exits. Notably, it
  does not include container startup latency." Same labels.
- ``container/instance_count``: GAUGE INT64 "1", "Number of container instances that exist, broken down by state"
  (label ``state``: active / idle).
All three are on the ``cloud_run_revision`` resource (project_id, service_name, revision_name, location,
configuration_name), "Sampled every 60 seconds. After sampling, data is not visible for up to 180 seconds."

Managed Service for Prometheus series (``prometheus.googleapis.com/NAME/SUFFIX`` on the ``prometheus_target``
resource) are not listed here: they exist once a writer, the GMP sidecar stand-in (sandbox/control/run/gmp_sidecar.py),
has written them (store.py ``MetricStore.write``), as Monitoring creates a custom metric's descriptor on its first
write. Their distributions have explicit buckets (``ExplicitDistribution``).

Bucket options: Cloud Run's latency distributions are exponential with growth factor 1.1 and scale 1 (bounds
717.95, 789.75, 868.72 ... ms and 235 buckets per distribution in prometheus-community/stackdriver_exporter issue
438, for container/probe_attempt_latencies); request_latencies is assumed to use the same.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

GROWTH, SCALE, FINITE_BUCKETS = 1.1, 1.0, 233
BUCKET_OPTIONS = {"exponentialBuckets": {"numFiniteBuckets": FINITE_BUCKETS, "growthFactor": GROWTH, "scale": SCALE}}
RESOURCE_TYPE = "cloud_run_revision"
REQUEST_COUNT = "run.googleapis.com/request_count"
REQUEST_LATENCIES = "run.googleapis.com/request_latencies"
INSTANCE_COUNT = "run.googleapis.com/container/instance_count"
PROMETHEUS_PREFIX = "prometheus.googleapis.com/"
PROMETHEUS_RESOURCE_TYPE = "prometheus_target"


@dataclass(frozen=True)
class Descriptor:
    type: str
    kind: str  # GAUGE / DELTA
    value_type: str  # INT64 / DOUBLE / DISTRIBUTION
    unit: str


DESCRIPTORS = {
    d.type: d
    for d in (
        Descriptor(REQUEST_COUNT, "DELTA", "INT64", "1"),
        Descriptor(REQUEST_LATENCIES, "DELTA", "DISTRIBUTION", "ms"),
        Descriptor(INSTANCE_COUNT, "GAUGE", "INT64", "1"),
    )
}


@dataclass
class Distribution:
    """count, mean, sum of squared deviation and exponential bucket counts, merged as Monitoring merges them."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (FINITE_BUCKETS + 2))

    @classmethod
    def of(cls, values: list[float]) -> Distribution:
        dist = cls()
        for value in values:
            dist.add(value)
        return dist

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)  # Welford, as the Distribution docs suggest
        self.buckets[bucket_of(value)] += 1

    def merged(self, other: Distribution) -> Distribution:
        count = self.count + other.count
        if not count:
            return Distribution()
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / count
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / count
        return Distribution(count, mean, m2, [a + b for a, b in zip(self.buckets, other.buckets, strict=True)])

    def percentile(self, p: float) -> float:
        """Interpolated within the bucket that holds the rank (a histogram keeps no values)."""
        if not self.count:
            return 0.0
        rank, seen = p / 100 * self.count, 0
        for i, n in enumerate(self.buckets):
            if n and seen + n >= rank:
                low, high = bucket_bounds(i)
                return low + (high - low) * max(rank - seen, 0) / n if math.isfinite(high) else low
            seen += n
        return bucket_bounds(len(self.buckets) - 1)[0]

    def to_json(self) -> dict:
        counts = list(self.buckets)
        while counts and counts[-1] == 0:
            counts.pop()  # "If the size is less than N, then the remaining buckets are assigned values of zero."
        body: dict = {
            "count": str(self.count),
            "bucketOptions": BUCKET_OPTIONS,
            "bucketCounts": [str(n) for n in counts],
        }
        if self.count:
            body["mean"] = self.mean
            body["sumOfSquaredDeviation"] = self.m2
        return body


@dataclass(frozen=True)
class ExplicitDistribution:
    """A Prometheus histogram as the GMP exporter writes it (opentelemetry-operations-go exporter/collector
    metrics.go: ``BucketOptions_ExplicitBuckets`` with the finite ``le`` bounds, mean = sum / count, no sum of squared
    deviation unless its EnableSumOfSquaredDeviation option is on, which the sidecar does not set).

    ``bucket_counts`` are not cumulative, as Monitoring's Distribution wants them: with N bounds there are N + 1
    buckets, 0 the underflow below bounds[0], i in [bounds[i-1], bounds[i]), N the overflow (the Distribution
    reference, "explicitBuckets")."""

    count: int
    total: float
    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def to_json(self) -> dict:
        body: dict = {"count": str(self.count)}
        if self.mean:  # proto3 JSON leaves zero numbers out
            body["mean"] = self.mean
        body["bucketOptions"] = {"explicitBuckets": {"bounds": list(self.bounds)}}
        body["bucketCounts"] = [str(n) for n in self.bucket_counts]
        return body


def bucket_of(value: float) -> int:
    """Bucket i > 0 spans [scale * growth^(i-1), scale * growth^i); 0 is the underflow, N-1 the overflow."""
    if value < SCALE:
        return 0
    i = math.floor(math.log(value / SCALE, GROWTH)) + 1
    while i > 1 and value < SCALE * GROWTH ** (i - 1):  # float error at exact bounds
        i -= 1
    return min(i, FINITE_BUCKETS + 1)


def bucket_bounds(i: int) -> tuple[float, float]:
    low = 0.0 if i == 0 else SCALE * GROWTH ** (i - 1)
    high = math.inf if i == FINITE_BUCKETS + 1 else SCALE * GROWTH**i
    return low, high


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


def parse_rfc3339(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp (up to nanoseconds, "Z" or an offset), or None when malformed."""
    match = _STAMP.match(text.strip())
    if match is None:
        return None
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    try:
        whole = datetime.fromisoformat(match.group(1) + zone).timestamp()
    except ValueError:
        return None
    return whole + (int(match.group(2).ljust(9, "0")) / 1e9 if match.group(2) else 0.0)


_DURATION = re.compile(r"^(\d+)(?:\.(\d{1,9}))?s$")


def parse_duration(text: str) -> float | None:
    """Seconds of a google-duration ("60s", "90.5s"), or None when malformed."""
    match = _DURATION.match(text.strip())
    if match is None:
        return None
    return int(match.group(1)) + (int(match.group(2).ljust(9, "0")) / 1e9 if match.group(2) else 0.0)
