"""Fault injection (issue 8), the service: failing candidates while clients call it, promotions racing for one
service, scale flows racing a promotion.

The outcomes each test asserts, and the helpers: tests/support/faults.py.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from flows.scale import scale_service
from tasks.common import clients
from tasks.report.report import PromotionReport
from tests.support.faults import (
    CHAT,
    TINY,
    completed,
    promote,
    run_in_threads,
    traffic,
    unique,
)
from tests.support.identity import bearer
from tests.support.locks import lock_slots, wait_until

# raised_quota: every test re-promotes an L4 service zero-downtime (its candidate beside the serving instance), which
# preflight refuses on a new project's 40 GiB (tests/e2e/test_new_project.py); these are about callers and races.
pytestmark = [pytest.mark.prefect, pytest.mark.usefixtures("raised_quota")]


# 8. Failing candidates while clients call the service ----------------------------------------------------------
# Two failing candidates per case, (instance faults, what the failed flow run says): dev, then v1.0.
FAILING_CANDIDATES = [
    pytest.param(
        ({"crash_at_start": "CUDA error: out of memory"}, "did not become ready"),
        ({"completions_status": 500}, "chat completion answered HTTP 500"),
        id="crash-at-start+completions-500",
    ),
    pytest.param(
        ({"engine_dead_after_requests": 0}, "failed the configured startup probe checks"),  # /health never 200
        ({"served_model_name": "someone/else"}, f"lists ['someone/else'] but not '{TINY}'"),
        id="never-healthy+wrong-model-name",
    ),
]


@pytest.mark.parametrize(("dev_fault", "v1_fault"), FAILING_CANDIDATES)
def test_failing_candidates_never_fail_a_caller(sb, flow_env, dev_fault, v1_fault):
    service = unique("flt-busy")
    first = completed(promote(TINY, service))
    stop = threading.Event()
    seen: list[str] = []
    failures: list[str] = []

    def call() -> None:
        with httpx.Client(headers=bearer(first.service_url), timeout=30) as client:
            while not stop.is_set():
                try:
                    response = client.post(f"{first.service_url}/v1/chat/completions", json=CHAT)
                    if response.status_code == 200:
                        seen.append(response.headers["x-sandbox-revision"])
                    else:
                        failures.append(f"HTTP {response.status_code}")
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    callers = [threading.Thread(target=call) for _ in range(3)]
    for caller in callers:
        caller.start()
    try:
        failed = []
        for revision, (faults, _) in (("dev", dev_fault), ("v1.0", v1_fault)):
            sb.run("POST", "/faults", json={"service": service, "faults": faults})
            failed.append(promote(TINY, service, revision=revision))
    finally:
        stop.set()
        for caller in callers:
            caller.join()
    for state, (_, expected) in zip(failed, (dev_fault, v1_fault), strict=True):
        assert state.is_failed() and expected in state.message, state.message
    assert failures == []
    assert len(seen) >= 20 and set(seen) == {first.serving_revision}
    assert traffic(flow_env, service) == [(first.serving_revision, 100, "")]


# 9. Promotions racing for one service --------------------------------------------------------------------------
def assert_one_history(reports: list[PromotionReport], final: list[tuple[str, int, str]]) -> None:
    """Each promoted run saw the previous one's revision serving: the (previous -> serving) pairs chain into one
    path from "no service" to what serves now. Two interleaved runs would both start from the same revision."""
    edges = [(r.previous_revision, r.serving_revision) for r in reports if r.outcome == "promoted"]
    node, remaining, path = None, list(edges), [None]
    while remaining:
        step = next((edge for edge in remaining if edge[0] == node), None)
        assert step is not None, f"promotions interleaved: none continues from {node} in {edges}"
        remaining.remove(step)
        node = step[1]
        path.append(node)
    assert final == [(node, 100, "")]
    for report in reports:
        if report.outcome == "unchanged":  # it found its own revision already serving all traffic
            assert report.previous_revision == report.serving_revision and report.serving_revision in path


def test_two_then_five_promotions_racing_for_one_service_never_interleave(flow_env):
    service = unique("flt-race")
    reports: list[PromotionReport] = []
    for size in (2, 5):
        revisions = [("main", "dev")[i % 2] for i in range(size)]
        calls = {
            f"{i}-{rev}": (lambda rev=rev: promote(TINY, service, revision=rev)) for i, rev in enumerate(revisions)
        }
        states = run_in_threads(calls)
        reports += [completed(state) for state in states.values()]
    assert sum(r.outcome == "promoted" for r in reports) >= 2
    assert_one_history(reports, traffic(flow_env, service))


# 10. Scale flows racing a promotion ----------------------------------------------------------------------------
def test_scale_flows_racing_a_promotion(sb, flow_env):
    service = unique("flt-scale")
    first = completed(promote(TINY, service))
    since = sb.last_request_seq()
    promotion: dict[str, object] = {}
    runner = threading.Thread(target=lambda: promotion.update(state=promote(TINY, service, revision="dev")))
    runner.start()
    try:
        wait_until(lambda: lock_slots(flow_env, service) == 1, 60, "the promotion to hold the service lock")
        scales = run_in_threads(
            {"min1": lambda: scale_service(service=service, min_instances=1),
             "min0": lambda: scale_service(service=service, min_instances=0)}
        )  # fmt: skip
    finally:
        runner.join()
    report = completed(promotion["state"])
    assert all(not isinstance(result, BaseException) for result in scales.values()), scales
    patches = [r for r in sb.requests("control", since=since) if r["method"] == "PATCH"]
    scaling = [r for r in patches if "updateMask=scaling" in r["query"]]
    assert scaling, "at least one of min 1 / min 0 changes the service"
    assert patches.index(scaling[0]) > max(i for i, r in enumerate(patches) if r not in scaling)  # never interleaved
    last_applied = json.loads(scaling[-1]["body"]).get("scaling", {}).get("minInstanceCount", 0)
    service_now = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")
    assert service_now.scaling.min_instance_count == last_applied
    assert (report.outcome, report.previous_revision) == ("promoted", first.serving_revision)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_a_promotion_keeps_the_min_instances_scale_service_set(flow_env):
    service = unique("flt-keepmin")
    completed(promote(TINY, service))
    assert scale_service(service=service, min_instances=1).changed
    completed(promote(TINY, service, revision="dev"))
    service_now = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")
    assert service_now.scaling.min_instance_count == 1
