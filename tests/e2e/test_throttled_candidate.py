"""A candidate too slow for its traffic: its instance stays busy, Cloud Run refuses what finds no free slot with 429
(sandbox/control/run/throttle.py), and the watch counts those refusals against the candidate and sends traffic back,
saying why. A healthy candidate under the same traffic is promoted."""

from __future__ import annotations

import pytest

from blocks.profile import ServingProfile
from tests.support.artifacts import artifact
from tests.support.promotion import promote_watched as promote
from tests.support.promotion import run_service

# The candidate runs beside the serving revision (zero-downtime): the watch's 429 mechanics, not the quota, are tested.
pytestmark = [pytest.mark.prefect, pytest.mark.usefixtures("raised_quota")]
PROFILE = "e2e-throttle"
RATE = 4.0  # the users' requests per real second, whatever the answers (open loop, as real users arrive)
SLOW_CHAT_MS = 200_000  # the slow candidate's every chat: 200 simulated s, 2 real s: 8 in flight for 4 slots
SLO = {"max_error_ratio": 0.05, "max_p95_ms": "off", "min_requests": 5}  # judged on the 429s, not on latency
NAMED = (
    r"watch 100 % breached the SLO: \d+ requests, 0 5xx, \d+ 429.*: error ratio \(0 5xx \+ \d+ 429\) [\d.]+% above "
    r"max_error_ratio 5\.0%; 429: the candidate could not keep up with its traffic at max instances 1 \(4 requests "
    r"each\)"
)


def test_a_candidate_too_slow_for_its_traffic_is_rolled_back_on_its_429s_and_a_healthy_one_is_promoted(
    sb, flow_env, traffic
):
    # One instance taking 4 requests at once (concurrency 4), small enough for two to run side by side.
    ServingProfile.preset("l4", cpu=4, memory_gib=16, concurrency=4, vllm={"max_num_seqs": 4}).save(
        PROFILE, overwrite=True
    )
    service = "throttled-candidate"
    promote(service, revision="v1.0", profile=PROFILE, watch={"samples": 0})
    client = traffic(service, rate_per_s=RATE)

    # Watch windows long enough for a few requests on a busy host; a breach ends one at once.
    healthy = promote(service, revision="main", profile=PROFILE, watch={"samples": 4, **SLO})
    assert healthy.outcome == "promoted"
    assert [step.throttled for step in healthy.delivery] == [0]
    assert not [a for a in client.answers if a.status == 429]

    sb.run("POST", "/faults", json={"service": service, "faults": {"first_token_delay_ms": SLOW_CHAT_MS},
                                    "revisions": 1})  # fmt: skip
    with pytest.raises(Exception, match=NAMED):
        promote(service, revision="dev", profile=PROFILE, watch={"samples": 10, **SLO})
    client.stop.set()

    service_now = run_service(flow_env, service)
    assert [(t.revision, t.percent) for t in service_now.traffic_statuses if t.percent] == [
        (healthy.serving_revision, 100)
    ]
    throttled = {a.revision for a in client.answers if a.status == 429}
    assert len(throttled) == 1 and healthy.serving_revision not in throttled  # only the slow candidate refused users
    text = artifact(f"promotion-{service}")
    assert "ROLLED BACK: watch 100 % breached the SLO" in text
    assert "429: the candidate could not keep up with its traffic at max instances 1 (4 requests each)" in text
