"""Alignment and reduction of timeSeries.list (https://cloud.google.com/monitoring/api/v3/aggregation, and the
Aggregation enums of the monitoring.v3 discovery document, whose descriptions say which aligner and reducer fits
which metric kind and value type).

Alignment: with a per-series aligner other than ALIGN_NONE, each series gets one point per alignment period, the
periods ending at the interval's end time, end - P, end - 2P, ... ("a single data point for each alignment_period
with end timestamp at the end of the period"); a raw point belongs to the period that holds its end time, and a
period without raw points has no aligned point (the sandbox does not interpolate). ``P`` is in simulated seconds
(sandbox clock; see store.py), so a 60 s period spans 0.6 s of real time at the default time_scale, and ALIGN_RATE
is per simulated second.

Reduction: aligned series are grouped by ``groupByFields`` (``metric.labels.K``, ``resource.labels.K``; resource
type is always kept) and each group's values at one timestamp are combined. The output keeps only the grouped labels
and the resource's project_id.

Validation, with Monitoring's wording where a public copy exists:
- "Field aggregation.alignmentPeriod had an invalid value of "10s": The alignment period must be greater than or
  equal to 1 minute." (spinnaker/spinnaker issue 3025); a missing period with an aligner is read as "0s".
- "Field aggregation.perSeriesAligner had an invalid value of "ALIGN_RATE": The aligner cannot be applied to
  metrics with kind DELTA and value type DISTRIBUTION." (google/exposure-notifications-verification-server issue
  659); reducers get the same sentence shape (unconfirmed).
- A reducer with ALIGN_NONE (the discovery doc: "If cross_series_reducer is specified, then per_series_aligner must
  be specified, and must not be ALIGN_NONE"): message unconfirmed.
Aligners and reducers the sandbox does not compute (interpolation, next-older, stddev, percent change, Boolean ones
on the metrics that could take them) are refused with 400 and a message saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox.control.errors import invalid_argument
from sandbox.control.monitoring.metrics import Distribution, parse_duration
from sandbox.control.monitoring.store import Point, Series

PERCENTILES = {"99": 99.0, "95": 95.0, "50": 50.0, "05": 5.0}
# Aligner -> the (kind, value type) pairs it applies to, from the discovery document's enum descriptions.
NUMERIC = {"INT64", "DOUBLE"}
ALIGNERS: dict[str, tuple[set[str], set[str]]] = {
    "ALIGN_DELTA": ({"DELTA", "CUMULATIVE"}, NUMERIC | {"DISTRIBUTION"}),
    "ALIGN_RATE": ({"DELTA", "CUMULATIVE"}, NUMERIC),
    "ALIGN_MIN": ({"GAUGE", "DELTA"}, NUMERIC),
    "ALIGN_MAX": ({"GAUGE", "DELTA"}, NUMERIC),
    "ALIGN_MEAN": ({"GAUGE", "DELTA"}, NUMERIC),
    "ALIGN_COUNT": ({"GAUGE", "DELTA"}, NUMERIC | {"BOOL"}),
    "ALIGN_SUM": ({"GAUGE", "DELTA"}, NUMERIC | {"DISTRIBUTION"}),
    **{f"ALIGN_PERCENTILE_{p}": ({"GAUGE", "DELTA"}, {"DISTRIBUTION"}) for p in PERCENTILES},
    "ALIGN_INTERPOLATE": ({"GAUGE"}, NUMERIC),
    "ALIGN_NEXT_OLDER": ({"GAUGE"}, NUMERIC | {"BOOL", "STRING", "DISTRIBUTION"}),
    "ALIGN_STDDEV": ({"GAUGE", "DELTA"}, NUMERIC),
    "ALIGN_COUNT_TRUE": ({"GAUGE"}, {"BOOL"}),
    "ALIGN_COUNT_FALSE": ({"GAUGE"}, {"BOOL"}),
    "ALIGN_FRACTION_TRUE": ({"GAUGE"}, {"BOOL"}),
    "ALIGN_PERCENT_CHANGE": ({"GAUGE", "DELTA"}, NUMERIC),
}
NOT_COMPUTED_ALIGNERS = {"ALIGN_INTERPOLATE", "ALIGN_NEXT_OLDER", "ALIGN_STDDEV", "ALIGN_PERCENT_CHANGE"}
REDUCERS: dict[str, set[str]] = {
    "REDUCE_SUM": NUMERIC | {"DISTRIBUTION"},
    "REDUCE_MEAN": NUMERIC | {"DISTRIBUTION"},
    "REDUCE_MIN": NUMERIC,
    "REDUCE_MAX": NUMERIC,
    "REDUCE_COUNT": NUMERIC | {"BOOL", "DISTRIBUTION", "STRING"},
    **{f"REDUCE_PERCENTILE_{p}": NUMERIC | {"DISTRIBUTION"} for p in PERCENTILES},
    "REDUCE_STDDEV": NUMERIC | {"DISTRIBUTION"},
    "REDUCE_COUNT_TRUE": {"BOOL"},
    "REDUCE_COUNT_FALSE": {"BOOL"},
    "REDUCE_FRACTION_TRUE": {"BOOL"},
}
NOT_COMPUTED_REDUCERS = {"REDUCE_STDDEV"}
MIN_PERIOD_S = 60


@dataclass(frozen=True)
class Aggregation:
    aligner: str
    period_s: float  # simulated seconds
    reducer: str
    group_by: tuple[str, ...]

    @property
    def aligns(self) -> bool:
        return self.aligner != "ALIGN_NONE"


def parse(query: Mapping[str, str], group_by: list[str]) -> Aggregation:
    """The ``aggregation.*`` query parameters, checked as Monitoring checks them (before the metric is known)."""
    aligner = query.get("aggregation.perSeriesAligner") or "ALIGN_NONE"
    reducer = query.get("aggregation.crossSeriesReducer") or "REDUCE_NONE"
    if aligner not in ALIGNERS and aligner != "ALIGN_NONE":
        raise invalid_argument(f"Invalid value at 'aggregation.per_series_aligner', \"{aligner}\"")
    if reducer not in REDUCERS and reducer != "REDUCE_NONE":
        raise invalid_argument(f"Invalid value at 'aggregation.cross_series_reducer', \"{reducer}\"")
    raw_period = query.get("aggregation.alignmentPeriod") or ""
    period = parse_duration(raw_period) if raw_period else 0.0
    if period is None:
        raise invalid_argument(
            f"Invalid value at 'aggregation.alignment_period' (type.googleapis.com/google.protobuf.Duration), "
            f'"{raw_period}"'
        )
    if reducer != "REDUCE_NONE" and aligner == "ALIGN_NONE":
        raise invalid_argument(
            'Field aggregation.perSeriesAligner had an invalid value of "ALIGN_NONE": a per-series aligner other '
            "than ALIGN_NONE is required when a cross-series reducer is specified."
        )
    if aligner != "ALIGN_NONE" and period < MIN_PERIOD_S:
        shown = raw_period or "0s"
        raise invalid_argument(
            f'Field aggregation.alignmentPeriod had an invalid value of "{shown}": The alignment period must be '
            "greater than or equal to 1 minute."
        )
    fields = tuple(_group_field(f) for f in group_by) if reducer != "REDUCE_NONE" else ()
    return Aggregation(aligner, period, reducer, fields)


def _group_field(text: str) -> str:
    parts = text.strip().split(".")
    if len(parts) == 3 and parts[0] in ("metric", "resource") and parts[1] in ("label", "labels") and parts[2]:
        return f"{parts[0]}.labels.{parts[2]}"
    if text.strip() == "resource.type":
        return "resource.type"
    raise invalid_argument(
        f'Field aggregation.groupByFields had an invalid value of "{text}": the sandbox groups by metric.labels.KEY '
        "and resource.labels.KEY only."
    )


def check(agg: Aggregation, kind: str, value_type: str) -> None:
    """400 when the aligner or reducer cannot apply to the metric, or when the sandbox does not compute it."""
    if agg.aligns:
        kinds, types = ALIGNERS[agg.aligner]
        if kind not in kinds or value_type not in types:
            raise invalid_argument(
                f'Field aggregation.perSeriesAligner had an invalid value of "{agg.aligner}": The aligner cannot be '
                f"applied to metrics with kind {kind} and value type {value_type}."
            )
        if agg.aligner in NOT_COMPUTED_ALIGNERS:
            raise invalid_argument(f"The sandbox does not compute {agg.aligner}; use another aligner.")
    if agg.reducer != "REDUCE_NONE":
        aligned_type = _aligned_type(agg.aligner, value_type)
        if aligned_type not in REDUCERS[agg.reducer]:
            raise invalid_argument(
                f'Field aggregation.crossSeriesReducer had an invalid value of "{agg.reducer}": The reducer cannot '
                f"be applied to metrics with value type {aligned_type}."
            )
        if agg.reducer in NOT_COMPUTED_REDUCERS:
            raise invalid_argument(f"The sandbox does not compute {agg.reducer}; use another reducer.")


def _aligned_type(aligner: str, value_type: str) -> str:
    if aligner in ("ALIGN_RATE", "ALIGN_MEAN") or aligner.startswith("ALIGN_PERCENTILE_"):
        return "DOUBLE"
    if aligner == "ALIGN_COUNT":
        return "INT64"
    return value_type


def _aligned_kind(aligner: str, kind: str) -> str:
    if aligner == "ALIGN_RATE" or aligner.startswith("ALIGN_PERCENTILE_"):
        return "GAUGE"
    return kind


def align(series: list[Series], agg: Aggregation, start: float, end: float, scale: float) -> list[Series]:
    """One point per alignment period ending at ``end``, ``end - P``, ... after ``start`` (real seconds)."""
    period = agg.period_s * scale
    aligned = []
    for s in series:
        windows: dict[int, list[Point]] = {}
        for p in s.points:
            if p.end > end or p.end <= start - period:
                continue
            # Window 0 is (end - P, end]; rounding keeps a point exactly on a boundary out of float noise.
            windows.setdefault(math.floor(round((end - p.end) / period, 9)), []).append(p)
        kind = _aligned_kind(agg.aligner, s.kind)
        points = []
        for k in sorted(windows):
            at = end - k * period
            if at <= start and k:
                continue
            value = _align_value(agg.aligner, [p.value for p in windows[k]], agg.period_s)
            points.append(Point(at - period if kind == "DELTA" else at, at, value))
        if points:
            aligned.append(Series(s.metric_type, s.metric_labels, s.resource_labels, kind,
                                  _aligned_type(agg.aligner, s.value_type), _unit(agg.aligner, s.unit), points,
                                  s.resource_type))  # fmt: skip
    return aligned


def _unit(aligner: str, unit: str) -> str:
    if aligner == "ALIGN_RATE":
        return f"{unit}/s" if unit != "1" else "1/s"
    if aligner == "ALIGN_COUNT":
        return "1"
    return unit


def _align_value(aligner: str, values: list, period_s: float):
    if aligner in ("ALIGN_DELTA", "ALIGN_SUM"):
        return _sum(values)
    if aligner == "ALIGN_RATE":
        return float(_sum(values)) / period_s
    if aligner == "ALIGN_MIN":
        return min(values)
    if aligner == "ALIGN_MAX":
        return max(values)
    if aligner == "ALIGN_MEAN":
        return sum(values) / len(values)
    if aligner == "ALIGN_COUNT":
        return len(values)
    merged = _sum(values)  # a percentile of everything the period's distributions hold
    return merged.percentile(PERCENTILES[aligner.rsplit("_", 1)[1]])


def _sum(values: list):
    if isinstance(values[0], Distribution):
        total = Distribution()
        for value in values:
            total = total.merged(value)
        return total
    return sum(values)


def reduce(series: list[Series], agg: Aggregation) -> list[Series]:
    """Combine aligned series that agree on the grouped labels, timestamp by timestamp."""
    groups: dict[tuple, list[Series]] = {}
    for s in series:
        groups.setdefault(tuple(_field_value(s, f) for f in agg.group_by), []).append(s)
    reduced = []
    for key, members in groups.items():
        by_end: dict[float, list[Point]] = {}
        for s in members:
            for p in s.points:
                by_end.setdefault(p.end, []).append(p)
        first = members[0]
        value_type = _reduced_type(agg.reducer, first.value_type)
        kind = first.kind if agg.reducer == "REDUCE_SUM" or agg.reducer == "REDUCE_COUNT" else "GAUGE"
        if agg.reducer in ("REDUCE_MIN", "REDUCE_MAX"):
            kind = first.kind
        points = []
        for at in sorted(by_end, reverse=True):
            group = by_end[at]
            start = min(p.start for p in group) if kind == "DELTA" else at
            points.append(Point(start, at, _reduce_value(agg.reducer, [p.value for p in group])))
        metric_labels = {f.split(".", 2)[2]: v for f, v in zip(agg.group_by, key, strict=True)
                         if f.startswith("metric.") and v is not None}  # fmt: skip
        # The project stays on every reduced series (as reduced outputs of the real API show; unconfirmed).
        resource_labels = {"project_id": first.resource_labels.get("project_id", "")}
        resource_labels.update({f.split(".", 2)[2]: v for f, v in zip(agg.group_by, key, strict=True)
                                if f.startswith("resource.labels.") and v is not None})  # fmt: skip
        unit = "1" if agg.reducer == "REDUCE_COUNT" else first.unit
        reduced.append(Series(first.metric_type, metric_labels, resource_labels, kind, value_type, unit, points,
                              first.resource_type))  # fmt: skip
    return reduced


def _field_value(s: Series, field: str) -> str | None:
    if field == "resource.type":
        return s.resource_type
    source = s.metric_labels if field.startswith("metric.") else s.resource_labels
    return source.get(field.split(".", 2)[2])


def _reduced_type(reducer: str, value_type: str) -> str:
    if reducer == "REDUCE_COUNT":
        return "INT64"
    if reducer == "REDUCE_MEAN" or reducer.startswith("REDUCE_PERCENTILE_"):
        return "DOUBLE"
    return value_type


def _reduce_value(reducer: str, values: list):
    if reducer == "REDUCE_SUM":
        return _sum(values)
    if reducer == "REDUCE_COUNT":
        return len(values)
    if reducer == "REDUCE_MIN":
        return min(values)
    if reducer == "REDUCE_MAX":
        return max(values)
    if isinstance(values[0], Distribution):
        merged = _sum(values)
        if reducer == "REDUCE_MEAN":
            return merged.mean
        return merged.percentile(PERCENTILES[reducer.rsplit("_", 1)[1]])
    if reducer == "REDUCE_MEAN":
        return sum(values) / len(values)
    return _percentile(sorted(float(v) for v in values), PERCENTILES[reducer.rsplit("_", 1)[1]])


def _percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks."""
    if len(ordered) == 1:
        return ordered[0]
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
