"""What Cloud Run really served, and the raw time series Monitoring builds from it.

Clock: point timestamps are real wall-clock time (the product compares them with its own clock); durations are
simulated, like every other duration in the sandbox. A sampling period is 60 simulated seconds (0.6 s real at the
default time_scale of 0.01), periods are aligned to multiples of their length since the epoch, and a period's point
becomes visible ``monitoring_delay_seconds`` simulated seconds after it ends ("Sampled every 60 seconds. After
sampling, data is not visible for up to 180 seconds."). Latencies are reported in simulated milliseconds
(real milliseconds / time_scale): a request that took 20 ms of real time took 2 s on the sandbox clock, which is
the clock model loads and probes run on too.

request_count and request_latencies have a DELTA point for each period with requests (none for quiet periods);
instance_count has a GAUGE point per period for each revision with a running instance (all counted "active").

Written series (``write``): what a writer sent with timeSeries.create, so far only the GMP sidecar stand-in
(sandbox/control/run/gmp_sidecar.py) with Managed Service for Prometheus series. Each write keeps its points as sent
(a CUMULATIVE point per scrape, its start the series' start); a point becomes visible to timeSeries.list
``prometheus_ingest_delay_seconds`` simulated seconds after it was written (sandbox/config.py; Google publishes no
figure for it). The first write of a metric type creates its descriptor (kind, value type), as Monitoring does for
custom metrics; a later point of another kind or value type is dropped, as Monitoring refuses it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from sandbox.config import SandboxConfig
from sandbox.control.monitoring.metrics import (
    DESCRIPTORS,
    INSTANCE_COUNT,
    REQUEST_COUNT,
    REQUEST_LATENCIES,
    RESOURCE_TYPE,
    Descriptor,
    Distribution,
    ExplicitDistribution,
)

SAMPLE_PERIOD_SIM_S = 60
MAX_EVENTS = 200_000
MAX_POINTS_PER_WRITTEN_SERIES = 50_000  # a bound on memory for a long sandbox session, far above any test's need


@dataclass(frozen=True)
class RequestEvent:
    """One request that reached a revision's instance, recorded when its response finished."""

    end: float  # real epoch seconds
    location: str
    service: str
    revision: str
    code: int
    latency_ms: float  # simulated milliseconds

    def to_json(self) -> dict:
        return {"end": self.end, "location": self.location, "service": self.service, "revision": self.revision,
                "code": self.code, "latency_ms": self.latency_ms}  # fmt: skip


@dataclass(frozen=True)
class InstanceSample:
    at: float  # real epoch seconds: the end of the sampling period
    location: str
    service: str
    revision: str
    active: int


@dataclass
class Point:
    start: float
    end: float
    value: int | float | Distribution | ExplicitDistribution


@dataclass(frozen=True)
class TimeSeriesWrite:
    """One series with one point, as timeSeries.create takes it."""

    metric_type: str
    metric_labels: dict[str, str]
    resource_type: str
    resource_labels: dict[str, str]
    kind: str  # GAUGE / CUMULATIVE
    value_type: str  # DOUBLE / DISTRIBUTION
    point: Point


@dataclass
class WrittenSeries:
    head: TimeSeriesWrite  # the first write: labels, kind and value type
    points: deque[tuple[Point, float]] = field(default_factory=lambda: deque(maxlen=MAX_POINTS_PER_WRITTEN_SERIES))


@dataclass
class Series:
    metric_type: str
    metric_labels: dict[str, str]
    resource_labels: dict[str, str]
    kind: str
    value_type: str
    unit: str
    points: list[Point]  # newest first
    resource_type: str = RESOURCE_TYPE

    def key(self) -> tuple:
        return (sorted(self.resource_labels.items()), sorted(self.metric_labels.items()))


def code_class(code: int) -> str:
    return f"{code // 100}xx"


class MetricStore:
    """Events and samples of one sandbox, turned into visible raw series on demand."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.events: deque[RequestEvent] = deque(maxlen=MAX_EVENTS)
        self.samples: deque[InstanceSample] = deque(maxlen=MAX_EVENTS)
        self.written: dict[str, dict[tuple, WrittenSeries]] = {}  # by metric type, then by resource and labels
        self.written_descriptors: dict[str, Descriptor] = {}

    @property
    def period(self) -> float:
        """A sampling period in real seconds."""
        return SAMPLE_PERIOD_SIM_S * self.config.time_scale

    def period_end(self, at: float) -> float:
        """The end of the sampling period that holds the real instant ``at``."""
        return (math.floor(at / self.period) + 1) * self.period

    def visible_until(self, now: float) -> float:
        """Periods ending at or before this real instant are visible."""
        return now - self.config.monitoring_delay_seconds * self.config.time_scale

    def record(self, event: RequestEvent) -> None:
        self.events.append(event)

    def sample(self, sample: InstanceSample) -> None:
        self.samples.append(sample)

    def descriptors(self) -> dict[str, Descriptor]:
        """Every metric type timeSeries.list knows: Cloud Run's and those written so far."""
        return {**self.written_descriptors, **DESCRIPTORS}

    def write(self, series: list[TimeSeriesWrite], at: float) -> int:
        """Keep the points of a timeSeries.create made at real time ``at``; returns how many were accepted."""
        accepted = 0
        for each in series:
            descriptor = self.written_descriptors.setdefault(
                each.metric_type, Descriptor(each.metric_type, each.kind, each.value_type, "")
            )
            if (descriptor.kind, descriptor.value_type) != (each.kind, each.value_type):
                continue  # a kind change of an existing type is refused by Monitoring (its exact answer: unconfirmed)
            key = (each.resource_type, tuple(sorted(each.resource_labels.items())),
                   tuple(sorted(each.metric_labels.items())))  # fmt: skip
            by_labels = self.written.setdefault(each.metric_type, {})
            by_labels.setdefault(key, WrittenSeries(each)).points.append((each.point, at))
            accepted += 1
        return accepted

    def written_series(self, metric_type: str, now: float) -> list[Series]:
        """The written series of ``metric_type`` with the points visible at real time ``now``, newest first."""
        horizon = now - self.config.prometheus_ingest_delay_seconds * self.config.time_scale
        found = []
        for written in self.written.get(metric_type, {}).values():
            head = written.head
            points = [point for point, at in reversed(written.points) if at <= horizon]  # written in time order
            found.append(Series(head.metric_type, dict(head.metric_labels), dict(head.resource_labels), head.kind,
                                head.value_type, "", points, head.resource_type))  # fmt: skip
        return found

    def raw_series(self, metric_type: str, now: float) -> list[Series]:
        """Every series of ``metric_type`` with the points visible at ``now``."""
        if metric_type not in DESCRIPTORS:
            return self.written_series(metric_type, now)
        descriptor = DESCRIPTORS[metric_type]
        horizon = self.visible_until(now)
        buckets: dict[tuple, dict[float, list]] = {}
        labels: dict[tuple, tuple[dict, dict]] = {}
        if metric_type == INSTANCE_COUNT:
            for s in self.samples:
                if s.at <= horizon:
                    key = (s.location, s.service, s.revision, "active")
                    labels[key] = (self._resource(s.location, s.service, s.revision), {"state": "active"})
                    buckets.setdefault(key, {}).setdefault(s.at, []).append(s.active)
        else:
            for e in self.events:
                end = self.period_end(e.end)
                if end > horizon:
                    continue
                key = (e.location, e.service, e.revision, e.code)
                metric = {
                    "response_code": str(e.code),
                    "response_code_class": code_class(e.code),
                    "route_type": "default",
                }
                labels[key] = (self._resource(e.location, e.service, e.revision), metric)
                buckets.setdefault(key, {}).setdefault(end, []).append(e.latency_ms)
        found = []
        for key, by_end in buckets.items():
            points = []
            for end in sorted(by_end, reverse=True):
                values = by_end[end]
                if metric_type == REQUEST_COUNT:
                    points.append(Point(end - self.period, end, len(values)))
                elif metric_type == REQUEST_LATENCIES:
                    points.append(Point(end - self.period, end, Distribution.of(values)))
                else:
                    points.append(Point(end, end, max(values)))
            resource, metric = labels[key]
            found.append(Series(metric_type, metric, resource, descriptor.kind, descriptor.value_type,
                                descriptor.unit, points))  # fmt: skip
        return found

    def _resource(self, location: str, service: str, revision: str) -> dict[str, str]:
        return {
            "project_id": self.config.project,
            "service_name": service,
            "revision_name": revision,
            "location": location,
            "configuration_name": service,
        }
