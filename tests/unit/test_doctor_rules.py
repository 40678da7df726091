"""doctor's pure rules: how an effective list policy admits a value, and which quota bucket applies."""

from __future__ import annotations

from google.cloud import orgpolicy_v2

from tasks.checks.doctor import list_policy_allows, location_values
from tasks.checks.quotas import effective_limit


def policy(*rules: dict) -> orgpolicy_v2.Policy:
    return orgpolicy_v2.Policy(spec={"rules": list(rules)})


def test_location_groups_admit_their_regions_and_no_others():
    us = location_values("us-central1")
    assert list_policy_allows(policy({"values": {"allowed_values": ["in:us-locations"]}}), us)
    assert list_policy_allows(policy({"values": {"allowed_values": ["is:us-central1"]}}), us)
    assert not list_policy_allows(policy({"values": {"allowed_values": ["in:eu-locations"]}}), us)
    assert list_policy_allows(
        policy({"values": {"allowed_values": ["in:eu-locations"]}}), location_values("europe-west4")
    )


def test_denied_values_and_deny_all_win_and_unset_admits_everything():
    us = location_values("us-central1")
    assert not list_policy_allows(policy({"values": {"denied_values": ["in:us-central1-locations"]}}), us)
    assert not list_policy_allows(policy({"deny_all": True}), us)
    assert list_policy_allows(policy({"allow_all": True}), us)
    assert list_policy_allows(orgpolicy_v2.Policy(), us)


def test_region_bucket_wins_over_the_default_and_unlimited_is_minus_one():
    metric = {"consumerQuotaLimits": [{"quotaBuckets": [
        {"effectiveLimit": "3"}, {"effectiveLimit": "1", "dimensions": {"region": "europe-west4"}},
    ]}]}  # fmt: skip
    assert effective_limit(metric, "europe-west4") == 1
    assert effective_limit(metric, "us-central1") == 3
    assert effective_limit({"consumerQuotaLimits": [{"quotaBuckets": [{"effectiveLimit": "-1"}]}]}, "x") == -1


def test_limits_without_buckets_or_values_read_as_no_limit_or_zero():
    assert effective_limit({"consumerQuotaLimits": [{"quotaBuckets": None}]}, "us-central1") is None
    assert effective_limit({"consumerQuotaLimits": None}, "us-central1") is None
    assert effective_limit({}, "us-central1") is None
    # proto3 JSON leaves a zero out: a region bucket without effectiveLimit is a quota of 0, not "unknown"
    assert effective_limit({"consumerQuotaLimits": [{"quotaBuckets": [{"dimensions": {"region": "x"}}]}]}, "x") == 0
