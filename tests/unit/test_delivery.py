"""Progressive delivery's pure parts: canary steps, splits, verdicts, latency percentiles, the report rows."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from blocks.profile import PRESETS, ServingProfile
from flows.common import ModelSpec, validated
from tasks.checks.preflight import check_candidate_quota
from tasks.deploy.traffic import canary_split
from tasks.report.report import PromotionReport
from tasks.watch.canary import Limits, RolledBack, StepResult, WatchOptions, check_canary, judge
from tasks.watch.monitoring import LatencyHistogram, RevisionTraffic, add_distribution, bucket_bounds, parse_time


def test_canary_steps_rise_from_1_to_99() -> None:
    assert check_canary([10, 50]) == [10, 50]
    assert check_canary(None) == []
    for steps, path in (([0], "canary[0]"), ([10, 100], "canary[1]"), ([50, 10], "canary[1]"), ([True], "canary[0]")):
        with pytest.raises(ValueError, match=rf"^{re.escape(path)}: "):
            check_canary(steps)


def test_a_model_file_canary_is_checked_with_its_path() -> None:
    with pytest.raises(ValidationError, match=r"canary\[1\]: 5 does not rise"):
        ModelSpec.model_validate({"canary": [10, 5]})
    with pytest.raises(ValidationError, match="max_error_rate"):
        ModelSpec.model_validate({"watch": {"max_error_rate": 0.1}})  # misspelt: refused, not ignored


@pytest.mark.parametrize(
    ("previous", "percent", "expected"),
    [
        ([("old", 100)], 10, [("new", 10), ("old", 90)]),
        ([("old", 100)], 50, [("new", 50), ("old", 50)]),
        ([("a", 50), ("b", 50)], 10, [("new", 10), ("a", 45), ("b", 45)]),
        ([("a", 67), ("b", 33)], 10, [("new", 10), ("a", 60), ("b", 30)]),
        ([("a", 99), ("b", 1)], 50, [("new", 50), ("a", 50)]),  # b's half a percent rounds away
    ],
)
def test_a_canary_split_adds_up_to_100_in_the_old_proportions(previous, percent, expected) -> None:
    split = canary_split(previous, "new", percent)
    assert split == expected
    assert sum(p for _, p in split) == 100


def traffic(ok: int, errors: int, latency_ms: float = 100.0) -> RevisionTraffic:
    seen = RevisionTraffic(requests=ok + errors, by_class={"2xx": ok, "5xx": errors})
    seen.latency.add(latency_ms, latency_ms * 1.4, ok + errors)
    return seen


def test_verdicts() -> None:
    watch = WatchOptions(max_error_ratio=0.02, max_p95_ms=1000, min_requests=10)
    assert judge(traffic(5, 4), watch)[0] == "too little traffic"
    verdict, reason = judge(traffic(50, 2), watch)
    assert verdict == "breached" and "5xx ratio 3.8% above max_error_ratio 2.0%" in reason
    assert judge(traffic(99, 1), watch)[0] == "held"
    verdict, reason = judge(traffic(100, 0, latency_ms=2000), watch)
    assert verdict == "breached" and "above max_p95_ms 1,000 ms" in reason


def test_cloud_runs_429s_are_the_candidates_failures_and_the_verdict_says_why() -> None:
    """A candidate too slow for its traffic: Cloud Run refused 40 of its 100 requests (every instance busy)."""
    seen = traffic(60, 0)
    seen.throttled = 40
    verdict, reason = judge(seen, WatchOptions(max_error_ratio=0.05, max_p95_ms="off"), limits=Limits(1, 4))
    assert verdict == "breached"
    assert reason.startswith("100 requests, 0 5xx, 40 429, request p95 ")
    assert ": error ratio (0 5xx + 40 429) 40.0% above max_error_ratio 5.0%; 429: " in reason
    assert "429: the candidate could not keep up with its traffic at max instances 1 (4 requests each)" in reason
    assert seen.error_ratio == 0.4 and seen.offered == 100
    # Within the budget they are figures, not a breach; without any, the figures read as before.
    few = traffic(99, 0)
    few.throttled = 1
    verdict, reason = judge(few, WatchOptions(max_error_ratio=0.05, max_p95_ms="off"))
    assert verdict == "held" and reason.startswith("100 requests, 0 5xx, 1 429, request p95 ")
    assert judge(traffic(100, 0), WatchOptions(max_p95_ms="off"))[1].startswith("100 requests, 0 5xx, request p95 ")


def test_an_empty_max_p95_ms_is_the_60_s_default_and_off_is_said_as_off() -> None:
    """Empty once meant "not judged": now it is the default, and only "off" turns the judgement off."""
    slow = traffic(100, 0, latency_ms=61_000)  # p95 above the 60 s default
    verdict, reason = judge(slow, WatchOptions(max_p95_ms=None))
    assert verdict == "breached" and "above max_p95_ms 60,000 ms" in reason
    assert judge(slow, WatchOptions())[0] == "breached"
    assert judge(traffic(100, 0, latency_ms=40_000), WatchOptions(max_p95_ms=None))[0] == "held"
    assert judge(slow, WatchOptions(max_p95_ms="off")) == ("held", "100 requests, 0 5xx, request p95 "
                                                           f"{slow.p95_ms:,.0f} ms: within the SLO")  # fmt: skip


@pytest.mark.parametrize(
    ("value", "says"),
    [(0, "0 could mean off"), ("0", "0 could mean off"), (False, "neither a limit"), ("none", "neither a limit"),
     ("OFF", "neither a limit"), (-1, "neither a limit")],
)  # fmt: skip
def test_a_max_p95_ms_that_could_mean_off_or_a_limit_is_refused_naming_the_field(value, says) -> None:
    with pytest.raises(ValidationError, match=rf"max_p95_ms\n.*{says}.*\"off\" not to judge it"):
        WatchOptions(max_p95_ms=value)
    # As the flow reads a model file's watch: the error leads with the field's whole path.
    with pytest.raises(ValueError, match=rf"^watch\.max_p95_ms: .*{says}"):
        validated(WatchOptions, {"max_p95_ms": value}, "watch")


def test_latency_percentiles_interpolate_within_buckets() -> None:
    histogram = LatencyHistogram()
    # Cloud Monitoring's exponential buckets: underflow, then [scale * g^(i-1), scale * g^i), then overflow.
    add_distribution(histogram, {
        "count": "100",
        "bucketOptions": {"exponentialBuckets": {"numFiniteBuckets": 3, "growthFactor": 10, "scale": 1}},
        "bucketCounts": ["0", "0", "90", "10"],  # trailing empty buckets omitted, as the API does
    })  # fmt: skip
    assert histogram.count == 100
    assert histogram.percentile(0.5) == pytest.approx(10 + 90 * (50 / 90))
    assert histogram.percentile(0.95) == pytest.approx(100 + 900 * 0.5)
    assert LatencyHistogram().percentile(0.95) is None


def test_bucket_bounds_of_each_kind() -> None:
    assert bucket_bounds({"linearBuckets": {"numFiniteBuckets": 2, "width": 5, "offset": 10}}, 0) == [
        (-math.inf, 10.0), (10.0, 15.0), (15.0, 20.0), (20.0, math.inf),
    ]  # fmt: skip
    assert bucket_bounds({"explicitBuckets": {"bounds": [1, 2]}}, 0) == [(-math.inf, 1.0), (1.0, 2.0), (2.0, math.inf)]


def test_nanosecond_timestamps_parse() -> None:
    assert parse_time("2026-12-01T15:00:00.123456789Z") == datetime(2026, 12, 1, 15, 0, 0, 123456, tzinfo=UTC)
    assert parse_time("2026-12-01T15:00:00Z") == datetime(2026, 12, 1, 15, tzinfo=UTC)


RTX_QUOTA = "NvidiaRtxPro6000GpuAllocNoZonalRedundancyPerProjectRegion"


def test_a_re_promotion_the_gpu_quota_cannot_hold_beside_the_serving_revision_offers_replace() -> None:
    rtx = ServingProfile.model_validate({**PRESETS["rtx-pro-6000"], "name": "rtx-pro-6000"})
    (finding,) = check_candidate_quota(rtx, "zero-downtime", [], True, quota=1, region="europe-west4",
                                       quota_id=RTX_QUOTA)  # fmt: skip
    assert finding.setting == "rollout" and finding.severity == "error"
    assert "2 nvidia-rtx-pro-6000 GPUs at once at the least" in finding.message
    assert f"request {RTX_QUOTA} of 2 GPUs for europe-west4" in finding.message
    assert "set rollout to replace" in finding.message and "answers 503" in finding.message
    # A canary needs the same GPU; replace cannot split traffic at all.
    assert check_candidate_quota(rtx, "zero-downtime", [10], True, 1, "europe-west4", RTX_QUOTA)
    (split,) = check_candidate_quota(rtx, "replace", [10], True, 1, "europe-west4", RTX_QUOTA)
    assert "no traffic to split" in split.message


def test_quota_for_both_a_first_deploy_and_replace_need_no_second_gpu() -> None:
    rtx = ServingProfile.model_validate({**PRESETS["rtx-pro-6000"], "name": "rtx-pro-6000"})
    l4 = ServingProfile.model_validate({**PRESETS["l4"], "name": "l4"})
    assert check_candidate_quota(rtx, "zero-downtime", [], False, 1, "us-central1", RTX_QUOTA) == []  # first deploy
    assert check_candidate_quota(rtx, "replace", [], True, 1, "us-central1", RTX_QUOTA) == []
    assert check_candidate_quota(l4, "zero-downtime", [10, 50], True, 3, "us-central1", RTX_QUOTA) == []
    # Three L4s, three instances at most: the candidate fits unless the serving revision is at its maximum.
    busy = l4.model_copy(update={"max_instances": 3})
    (warning,) = check_candidate_quota(busy, "zero-downtime", [], True, 3, "us-central1", RTX_QUOTA)
    assert warning.severity == "warning" and "request 4" in warning.message
    assert check_candidate_quota(rtx, "zero-downtime", [10], True, -1, "us-central1", RTX_QUOTA) == []  # unlimited


def test_the_report_has_a_row_per_step_and_says_where_traffic_went_back() -> None:
    report = PromotionReport(model="m", revision="main", service="svc", project="p", region="r",
                             candidate_revision="svc-new", traffic=[("svc-old", 100)])  # fmt: skip
    report.delivery = [
        StepResult(step="canary 10 %", split="svc-new 10 % / svc-old 90 %", requests=40, errors=0, error_ratio=0.0,
                   p95_ms=812.0, verdict="held", reason="40 requests, 0 5xx: within the SLO", seconds=6.1),
        StepResult(step="canary 50 %", split="svc-new 50 % / svc-old 50 %", requests=30, errors=9, error_ratio=0.3,
                   p95_ms=900.0, verdict="breached", reason="5xx ratio 30.0% above max_error_ratio 2.0%", seconds=2.0),
    ]  # fmt: skip
    report.fail(RolledBack("canary 50 % breached the SLO: ...; traffic is back on svc-old 100 %"))
    text = report.markdown()
    assert report.outcome == "rolled-back"
    assert "ROLLED BACK: canary 50 % breached the SLO" in text
    assert "| canary 10 % | svc-new 10 % / svc-old 90 % | 40 | 0 (0.0%) | - | - | - | 812 ms | held:" in text
    assert "| canary 50 % | svc-new 50 % / svc-old 50 % | 30 | 9 (30.0%) | - | - | - | 900 ms | BREACHED:" in text
    assert "svc-old (again: svc-new rolled back)" in text
