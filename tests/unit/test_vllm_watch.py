"""The watch on vLLM's own metrics (metrics: vllm): stream errors, TTFT and TPOT judged; Cloud Monitoring's cumulative
Prometheus points turned into what one traffic step served."""

from __future__ import annotations

import pytest

from tasks.watch.canary import WatchOptions, judge
from tasks.watch.monitoring import LatencyHistogram, RevisionTraffic, parse_time
from tasks.watch.vllm_metrics import VllmSignals, _add_histogram_delta, _counter_delta, _step_deltas

TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]


def requests(n: int, errors: int = 0, latency_ms: float = 100_000.0) -> RevisionTraffic:
    seen = RevisionTraffic(requests=n, by_class={"2xx": n - errors, "5xx": errors})
    seen.latency.add(latency_ms, latency_ms * 1.1, n)
    return seen


def signals(ttft_ms: float = 80, tpot_ms: float = 30, error: int = 0, http_5xx: int = 0, n: int = 100) -> VllmSignals:
    found = VllmSignals(finished={"stop": n - error, "error": error}, http_5xx=http_5xx)
    found.ttft.add(ttft_ms, ttft_ms * 1.01, n)
    found.tpot.add(tpot_ms, tpot_ms * 1.01, n)
    return found


def test_streams_that_failed_after_their_200_count_as_failed_requests():
    verdict, reason = judge(requests(100), WatchOptions(), signals(error=33))
    assert verdict == "breached"
    assert "error ratio (0 5xx + 33 stream errors) 33.0% above max_error_ratio 1.0%" in reason
    # Without vLLM's metrics the same candidate passes: every request was a 200 to Cloud Run.
    assert judge(requests(100, latency_ms=1000), WatchOptions(), None)[0] == "held"


def test_a_failure_that_was_a_5xx_is_not_counted_twice():
    found = signals(error=3, http_5xx=3)
    assert found.stream_errors == 0
    verdict, reason = judge(requests(100, errors=3), WatchOptions(max_error_ratio=0.05), found)
    assert verdict == "held", reason


def test_slow_first_tokens_breach_on_ttft_p95_and_say_so():
    verdict, reason = judge(requests(100), WatchOptions(), signals(ttft_ms=2_600))
    assert verdict == "breached" and "TTFT p95 2,6" in reason and "above max_ttft_p95_ms 2,000 ms" in reason
    verdict, reason = judge(requests(100), WatchOptions(max_tpot_p95_ms=20), signals(tpot_ms=30))
    assert verdict == "breached" and "above max_tpot_p95_ms 20 ms" in reason


def test_long_answers_are_not_judged_on_request_latency_when_ttft_and_tpot_are():
    long_answers = requests(100, latency_ms=120_000)
    assert judge(long_answers, WatchOptions(), signals())[0] == "held"
    assert judge(long_answers, WatchOptions(), None)[0] == "breached"  # 60 s default on request metrics alone
    assert judge(long_answers, WatchOptions(max_p95_ms=90_000), signals())[0] == "breached"  # unless asked
    # "off" is off on either metrics; empty is the default, which differs between them.
    assert judge(long_answers, WatchOptions(max_p95_ms="off"), None)[0] == "held"
    assert judge(long_answers, WatchOptions(max_p95_ms="off"), signals())[0] == "held"
    assert judge(long_answers, WatchOptions(max_p95_ms=None), None)[0] == "breached"


def test_ttft_and_tpot_limits_need_the_sidecar():
    with pytest.raises(ValueError, match=r"^watch.max_ttft_p95_ms: .*set metrics: vllm"):
        WatchOptions(max_ttft_p95_ms=500).refuse_without_vllm_metrics("none")
    WatchOptions(max_ttft_p95_ms=500).refuse_without_vllm_metrics("vllm")


def point(end: str, start: str, value: dict) -> dict:
    return {"interval": {"startTime": start, "endTime": end}, "value": value}


def counted(series: dict, since: str) -> int:
    return sum(_counter_delta(newest, baseline) for newest, baseline in _step_deltas(series, parse_time(since)))


def test_a_step_counts_cumulative_points_from_the_scrape_before_it_began():
    start = "2026-12-02T10:00:00Z"
    series = {"points": [point("2026-12-02T10:00:30Z", start, {"doubleValue": 5.0}),
                         point("2026-12-02T10:01:00Z", start, {"doubleValue": 9.0}),
                         point("2026-12-02T10:01:30Z", start, {"doubleValue": 20.0})]}  # fmt: skip
    assert counted(series, "2026-12-02T10:01:10Z") == 11
    assert counted(series, "2026-12-02T10:01:40Z") == 0  # nothing scraped since the step began
    # A series that began after the step (a new instance) counts from zero.
    later = {"points": [point("2026-12-02T10:02:00Z", "2026-12-02T10:01:40Z", {"doubleValue": 4.0})]}
    assert counted(later, "2026-12-02T10:01:10Z") == 4


def test_a_restart_within_the_step_keeps_what_the_old_process_counted():
    start, restart = "2026-12-02T10:00:00Z", "2026-12-02T10:01:40Z"
    series = {"points": [point("2026-12-02T10:01:00Z", start, {"doubleValue": 10.0}),
                         point("2026-12-02T10:01:30Z", start, {"doubleValue": 50.0}),
                         point("2026-12-02T10:02:00Z", restart, {"doubleValue": 2.0})]}  # fmt: skip
    assert counted(series, "2026-12-02T10:01:10Z") == 40 + 2


def test_requests_are_vllms_finished_ones_when_cloud_runs_count_lags():
    lagging = requests(10)
    verdict, reason = judge(lagging, WatchOptions(), signals(error=33, n=100))
    assert verdict == "breached"
    assert reason.startswith("100 requests, 0 5xx, 33 stream errors") and "33.0% above" in reason


def test_until_vllms_figures_arrive_latency_is_judged_on_request_metrics():
    empty = VllmSignals()
    verdict, reason = judge(requests(100, latency_ms=99_500), WatchOptions(), empty)
    assert verdict == "breached" and "above max_p95_ms 60,000 ms" in reason
    assert judge(requests(100, latency_ms=99_500), WatchOptions(max_p95_ms="off"), empty)[0] == "held"


def test_histogram_deltas_keep_vllms_buckets_in_ms():
    def dist(counts: list[int]) -> dict:
        return {"distributionValue": {"count": str(sum(counts)), "bucketCounts": [str(c) for c in counts],
                                      "bucketOptions": {"explicitBuckets": {"bounds": TTFT_BOUNDS}}}}  # fmt: skip

    before = [0] * 9 + [10]  # ten first tokens in [0.25 s, 0.5 s) before the step
    after = [0] * 9 + [10] + [0] * 3 + [20]  # twenty more in [2.5 s, 5 s) during it
    histogram = LatencyHistogram()
    start = "2026-12-02T10:00:00Z"
    _add_histogram_delta(histogram, point("2026-12-02T10:02:00Z", start, dist(after)),
                         point("2026-12-02T10:01:00Z", start, dist(before)))  # fmt: skip
    assert histogram.count == 20
    assert 2_500 <= histogram.percentile(0.95) <= 5_000
