"""The Monitoring stand-in's alignment and reduction on hand-built series (pure functions, no server)."""

from __future__ import annotations

import pytest

from sandbox.control.errors import GoogleApiError
from sandbox.control.monitoring import aggregation
from sandbox.control.monitoring.metrics import REQUEST_COUNT, REQUEST_LATENCIES, Distribution
from sandbox.control.monitoring.store import Point, Series

SCALE = 0.01  # real seconds per simulated second: a 60 s period is 0.6 s of real time
P = 60 * SCALE
END = 1_000_000.0  # the query's end time (real epoch seconds)


def counts(code_class: str, revision: str, values: list[tuple[float, int]]) -> Series:
    """A request_count series with DELTA points (real end time, count), newest first."""
    points = [Point(end - P, end, n) for end, n in sorted(values, reverse=True)]
    resource = {"project_id": "p", "revision_name": revision}
    return Series(REQUEST_COUNT, {"response_code_class": code_class}, resource, "DELTA", "INT64", "1", points)


def agg(aligner: str, period: str = "60s", reducer: str = "REDUCE_NONE", group_by: tuple[str, ...] = ()):
    query = {"aggregation.perSeriesAligner": aligner, "aggregation.alignmentPeriod": period}
    if reducer != "REDUCE_NONE":
        query["aggregation.crossSeriesReducer"] = reducer
    return aggregation.parse(query, list(group_by))


def test_one_aligned_point_per_period_ending_at_the_end_time_newest_first():
    # Raw points in the windows (END-P, END], (END-2P, END-P] and (END-4P, END-3P]; none in the third.
    s = counts("2xx", "r1", [(END - 0.1, 3), (END - P, 2), (END - P - 0.2, 1), (END - 3.5 * P, 7)])
    [aligned] = aggregation.align([s], agg("ALIGN_DELTA"), END - 10 * P, END, SCALE)
    assert [(round((END - p.end) / P), p.value) for p in aligned.points] == [(0, 3), (1, 3), (3, 7)]
    assert all(round(p.end - p.start, 9) == round(P, 9) for p in aligned.points)  # DELTA: (end - P, end]
    assert aligned.kind == "DELTA" and aligned.value_type == "INT64"


def test_points_outside_the_interval_are_left_out():
    s = counts("2xx", "r1", [(END + 0.1, 5), (END - 0.1, 1), (END - 20 * P, 9)])
    [aligned] = aggregation.align([s], agg("ALIGN_SUM"), END - 5 * P, END, SCALE)
    assert [p.value for p in aligned.points] == [1]


def test_rate_is_per_simulated_second_and_a_gauge():
    s = counts("2xx", "r1", [(END - 0.1, 30)])
    [rate] = aggregation.align([s], agg("ALIGN_RATE"), END - P, END, SCALE)
    assert rate.points[0].value == pytest.approx(0.5) and rate.kind == "GAUGE" and rate.value_type == "DOUBLE"
    assert rate.points[0].start == rate.points[0].end


def test_reduce_sum_groups_by_label_and_keeps_only_the_grouped_labels():
    series = [
        counts("2xx", "r1", [(END - 0.1, 3)]),
        counts("5xx", "r1", [(END - 0.1, 1)]),
        counts("2xx", "r2", [(END - 0.1, 4)]),
    ]
    by_class = agg("ALIGN_DELTA", "600s", "REDUCE_SUM", ("metric.labels.response_code_class",))
    reduced = aggregation.reduce(aggregation.align(series, by_class, END - 10 * P, END, SCALE), by_class)
    assert {s.metric_labels["response_code_class"]: s.points[0].value for s in reduced} == {"2xx": 7, "5xx": 1}
    assert all(s.resource_labels == {"project_id": "p"} for s in reduced)
    everything = agg("ALIGN_DELTA", "600s", "REDUCE_SUM")
    [total] = aggregation.reduce(aggregation.align(series, everything, END - 10 * P, END, SCALE), everything)
    assert total.points[0].value == 8 and total.metric_labels == {}


def test_percentiles_of_distributions_merge_the_period_first():
    fast = Distribution.of([100.0] * 90)
    slow = Distribution.of([2000.0] * 10)
    s = Series(REQUEST_LATENCIES, {}, {"revision_name": "r1"}, "DELTA", "DISTRIBUTION", "ms",
               [Point(END - P, END - 0.1, slow), Point(END - 2 * P, END - P - 0.1, fast)])  # fmt: skip
    p50 = agg("ALIGN_PERCENTILE_50", "600s")
    p99 = agg("ALIGN_PERCENTILE_99", "600s")
    [median] = aggregation.align([s], p50, END - 10 * P, END, SCALE)
    [tail] = aggregation.align([s], p99, END - 10 * P, END, SCALE)
    assert 100 / 1.1 <= median.points[0].value <= 100 * 1.1
    assert 2000 / 1.1 <= tail.points[0].value <= 2000 * 1.1
    assert tail.kind == "GAUGE" and tail.value_type == "DOUBLE" and tail.unit == "ms"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"aggregation.perSeriesAligner": "ALIGN_DELTA", "aggregation.alignmentPeriod": "30s"}, "at least"),
        ({"aggregation.perSeriesAligner": "ALIGN_DELTA"}, '"0s"'),
        ({"aggregation.crossSeriesReducer": "REDUCE_SUM"}, "ALIGN_NONE"),
        ({"aggregation.perSeriesAligner": "ALIGN_DELTA", "aggregation.alignmentPeriod": "1m"}, "Duration"),
    ],
)
def test_malformed_aggregations_are_refused(query, message):
    with pytest.raises(GoogleApiError) as refused:
        aggregation.parse(query, [])
    assert refused.value.code == 400
    assert message in refused.value.message or (message == "at least" and "1 minute" in refused.value.message)


@pytest.mark.parametrize(
    ("aligner", "kind", "value_type"),
    [
        ("ALIGN_RATE", "DELTA", "DISTRIBUTION"),
        ("ALIGN_PERCENTILE_95", "DELTA", "INT64"),
        ("ALIGN_RATE", "GAUGE", "INT64"),
    ],
)
def test_aligners_that_do_not_fit_the_metric_are_refused(aligner, kind, value_type):
    with pytest.raises(GoogleApiError, match="The aligner cannot be applied to metrics with kind"):
        aggregation.check(agg(aligner), kind, value_type)
