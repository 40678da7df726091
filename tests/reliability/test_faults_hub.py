"""Fault injection (issue 8), the Hub: 429s for a whole promotion, connections dropped mid-file, 500 and 503 bursts.

The outcomes each test asserts, and the helpers: tests/support/faults.py.
"""

from __future__ import annotations

import pytest

from tests.support.faults import (
    assert_staged_once_and_verified,
    completed,
    new_repo,
    promote,
    traffic,
    unique,
)

pytestmark = pytest.mark.prefect


# 1-3. The Hub --------------------------------------------------------------------------------------------------
def test_half_of_all_hub_requests_rate_limited_for_a_whole_promotion(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-429")
    # With seed 27 and this flow's requests (3 sequential Hub calls, then 9 files on 4 threads), a simulation of
    # 2000 interleavings never needs more than 3 of the policy's 8 attempts: a heavy storm, deterministic enough.
    # The CDN sees only the 3 shards: seed 3 answers its first request 429 and never more than 2 in a row (seed 27's
    # first three draws all pass, so the CDN was never limited).
    for server, seed in (("hub", 27), ("cdn", 3)):
        sb.add_fault(server, status=429, retry_after="1", fraction=0.5, seed=seed)
    since = sb.last_request_seq()
    state = promote(repo, service)
    report = completed(state)
    calls = [r for r in sb.requests(since=since) if r["server"] in ("hub", "cdn")]
    limited = [r for r in calls if r["status"] == 429]
    assert limited and all(r["fault"] for r in limited)
    assert report.outcome == "promoted"
    assert report.staging.rate_limit_waits > 0
    assert report.staging.seconds_waited >= report.staging.rate_limit_waits  # each waited the Retry-After in full
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_connections_dropped_mid_file_resume_with_range_requests(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-drop")
    sb.add_fault("cdn", action="drop", after_bytes=300_000, times=3)
    since = sb.last_request_seq()
    report = completed(promote(repo, service))
    cdn = sb.requests("cdn", since=since)
    starts = [int(r["headers"]["range"].removeprefix("bytes=").rstrip("-")) for r in cdn if "range" in r["headers"]]
    assert len(starts) == 3 and all(0 < start <= 300_000 for start in starts)  # resumed where they stopped
    assert sum(1 for r in cdn if "range" not in r["headers"]) == 3  # each shard was started once, never restarted
    shard_lookups = [r for r in sb.requests("hub", since=since) if r["path"].endswith(".safetensors")]
    assert len(shard_lookups) == 3  # resumes went to the signed CDN URL without asking the Hub again
    assert report.staging.other_retries >= 3
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_bursts_of_500_from_the_hub(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-500")
    sb.add_fault("hub", path="^/api/models/", status=500, times=1)  # the revision lookup
    sb.add_fault("hub", path=r"/resolve/.*\.safetensors$", status=500, times=3)  # the shards, in parallel
    since = sb.last_request_seq()
    report = completed(promote(repo, service))
    assert [rule["fired"] for rule in sb.faults()] == [1, 3]
    assert sum(1 for r in sb.requests("hub", since=since) if r["status"] == 500) == 4
    assert report.staging.other_retries >= 3
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
