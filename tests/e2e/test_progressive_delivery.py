"""Progressive delivery under real traffic: a background client calls the service the whole time, the watch reads
the sandbox's Cloud Monitoring (computed from the requests its Cloud Run front end proxied), and a candidate that
passes the probes but fails real requests is rolled back by the flow itself."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import Log
from prefect.logging.handlers import APILogWorker

from tests.support.artifacts import artifact
from tests.support.promotion import promote_watched as promote
from tests.support.promotion import run_service

pytestmark = [
    pytest.mark.prefect,
    # Canary, watch and rollback keep the candidate beside the serving revision (two L4 instances, 64 GiB of a new
    # project's 40): a team delivering this way requested the quota (test_new_project.py covers the refusal).
    pytest.mark.usefixtures("raised_quota"),
]
SLO = {"max_error_ratio": 0.02, "max_p95_ms": "off", "min_requests": 5}  # the faults here are errors, not latency
_ids = itertools.count()


@pytest.fixture
def service() -> str:
    return f"pd-{next(_ids)}"


def fails_under_traffic(sb, service: str) -> None:
    """The next revision of ``service`` answers every long prompt with 500 (the probe's short chat passes)."""
    faults = {"fail_prompts_longer_than": 40}
    sb.run("POST", "/faults", json={"service": service, "faults": faults, "revisions": 1})


def serving(flow_env, service: str) -> list[tuple[str, int, str]]:
    return [(s.revision, s.percent, s.tag) for s in run_service(flow_env, service).traffic_statuses]


def flow_run_logs(flow_run_id: UUID) -> list[Log]:
    """Every line of a flow run's logs, its own and its task runs', as the Prefect API keeps them (the UI's view)."""
    APILogWorker.drain_all()  # logs reach the API in batches

    async def read() -> list[Log]:
        logs: list[Log] = []
        async with get_client() as client:
            only_this_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            while page := await client.read_logs(only_this_run, limit=200, offset=len(logs)):
                logs += page
        return logs

    return asyncio.run(read())


def test_a_candidate_failing_under_traffic_is_rolled_back_within_the_watch(
    sb, flow_env, service, traffic, asserting_events_worker
):
    old = promote(service, watch={"samples": 0}).serving_revision
    client = traffic(service)
    fails_under_traffic(sb, service)
    samples = 10
    since = sb.last_request_seq()
    breach = r"watch 100 % breached the SLO: \d+ requests, \d+ 5xx, request p95 [\d,]+ ms: 5xx ratio"
    with pytest.raises(Exception, match=breach):
        promote(service, revision="dev", watch={"samples": samples, **SLO})
    rolled_back_at = time.monotonic()
    time.sleep(0.5)  # a little traffic after the rollback: it must all be answered
    client.stop.set()

    # Traffic is back on the old revision, with no tag left behind; the client saw errors only from the candidate,
    # and none once traffic was back.
    assert [(r, p) for r, p, _ in serving(flow_env, service) if p] == [(old, 100)]
    assert all(tag == "" for _, _, tag in serving(flow_env, service))
    errors = client.errors()
    assert errors, "the candidate never failed a request: the fault did not take"
    (candidate,) = {a.revision for a in errors}
    assert candidate != old and all(a.long_prompt for a in errors)
    assert not [a for a in client.answers if a.started > rolled_back_at and a.status >= 500]
    # During the watch the old revision was kept warm at its `previous` tag URL, so the way back was instant.
    assert [r["status"] for r in sb.requests(f"run:{service}:previous", since=since) if r["path"] == "/health"]
    assert [a.revision for a in client.answers if a.started > rolled_back_at] == [old] * len(
        [a for a in client.answers if a.started > rolled_back_at]
    )

    # The report tells the story: the step's figures, the verdict, where traffic stands; the watch ended early.
    text = artifact(f"promotion-{service}")
    assert "ROLLED BACK: watch 100 % breached the SLO" in text
    assert f"| watch 100 % | {candidate} 100 % |" in text and "BREACHED" in text
    assert f"| traffic now | {old} 100 % |" in text
    watch_seconds = float(text.split("| watch | ")[1].split(" |")[0])
    assert watch_seconds < samples * flow_env.metrics_sample_seconds

    # Automations hear of it: model.rolled_back, with the step figures that decided.
    asserting_events_worker.drain()
    events = [e for e in asserting_events_worker._client.events if e.event.startswith("model.")]
    rolled_back = [e for e in events if e.event == "model.rolled_back" and e.resource.name == service]
    assert len(rolled_back) == 1 and [list(t) for t in rolled_back[0].payload["traffic"]] == [[old, 100]]
    assert rolled_back[0].payload["steps"][-1]["verdict"] == "breached"


def test_a_canary_that_fails_is_rolled_back_and_only_its_share_saw_errors(sb, flow_env, service, traffic):
    old = promote(service, watch={"samples": 0}).serving_revision
    client = traffic(service)
    fails_under_traffic(sb, service)
    with pytest.raises(Exception, match=r"canary 25 % breached the SLO"):
        promote(service, revision="dev", canary=[25, 50], watch={"samples": 10, **SLO})
    client.stop.set()

    assert [(r, p) for r, p, _ in serving(flow_env, service) if p] == [(old, 100)]
    long_answers = [a for a in client.answers if a.long_prompt]
    candidate_share = {a.revision for a in client.errors()}
    assert len(candidate_share) == 1 and old not in candidate_share
    # The old revision kept answering long prompts while the candidate had its quarter of them.
    assert any(a.revision == old and a.status == 200 for a in long_answers)
    text = artifact(f"promotion-{service}")
    assert "| canary 25 % |" in text and "canary 50 %" not in text.split("## Details")[0].split("Traffic steps")[1]


def test_a_healthy_canary_reaches_100_percent_through_its_steps(sb, flow_env, service, traffic):
    first = promote(service, watch={"samples": 0}, return_state=True)
    old = first.result().serving_revision
    client = traffic(service)
    since = sb.last_request_seq()
    state = promote(service, revision="dev", canary=[10, 50], watch={"samples": 2, **SLO}, return_state=True)
    client.stop.set()
    report = state.result()
    new = report.serving_revision
    assert report.outcome == "promoted" and new != old

    # The traffic splits Cloud Run was sent, in order: the candidate's 0 % tag, 10/90, 50/50, 100 with the old
    # revision tagged for the watch, then 100 alone.
    splits = []
    for entry in sb.requests(since=since):
        if entry["method"] == "PATCH" and entry["path"].endswith(f"/services/{service}") and entry["status"] == 200:
            body = json.loads(entry["body"])
            if "traffic" in body:  # not the update that records the candidate's verdict (annotations only)
                splits.append([(t["revision"], t.get("percent", 0)) for t in body["traffic"]])
    assert splits[1:] == [
        [(new, 10), (old, 90)],
        [(new, 50), (old, 50)],
        [(new, 100), (old, 0)],
        [(new, 100)],
    ]
    assert [(r, p) for r, p, _ in serving(flow_env, service) if p] == [(new, 100)]
    assert [step.step for step in report.delivery] == ["canary 10 %", "canary 50 %", "watch 100 %"]
    assert all(step.verdict != "breached" for step in report.delivery)
    assert not client.errors()

    # A promotion's logs carry no traceback that is not a failure: every line of each run (a first deploy, then this
    # canary) and of each of its task runs, e.g. no "Error encountered when computing cache key" from a task whose
    # inputs hold a lock's method.
    for run in (first, state):
        logs = flow_run_logs(run.state_details.flow_run_id)
        assert {log.task_run_id is None for log in logs} == {True, False}, "the flow's and the task runs' lines"
        problems = [f"{logging.getLevelName(log.level)} {log.message}" for log in logs
                    if log.level >= logging.ERROR or "Traceback" in log.message]  # fmt: skip
        assert problems == []


def test_a_watch_that_cannot_read_the_metrics_fails_before_traffic_moves(sb, flow_env, service):
    old = promote(service, watch={"samples": 0}).serving_revision
    disabled = sb.configure()["disabled_apis"]
    sb.configure(disabled_apis=[*disabled, "monitoring.googleapis.com"])
    try:
        with pytest.raises(Exception, match=r"gcloud services enable monitoring\.googleapis\.com"):
            promote(service, revision="dev", watch={"samples": 2})
    finally:
        sb.configure(disabled_apis=disabled)
    # The candidate was verified but never took traffic: the old revision serves alone, untagged.
    assert serving(flow_env, service) == [(old, 100, "")]
    text = artifact(f"promotion-{service}")
    assert "NOT promoted: the verify step failed" in text


def test_a_rerun_finishes_the_watch_of_a_promotion_killed_while_watching(sb, flow_env, service):
    from google.cloud import run_v2

    from tasks.common.naming import PREVIOUS_TAG
    from tasks.deploy.cloudrun import BY_REVISION, _set_traffic

    old = promote(service, watch={"samples": 0}).serving_revision
    new = promote(service, revision="dev", watch={"samples": 0}).serving_revision
    # What a run killed during its watch leaves behind: the new revision at 100 %, the old one tagged and warm.
    _set_traffic(flow_env, service, [
        run_v2.TrafficTarget(type_=BY_REVISION, revision=new, percent=100),
        run_v2.TrafficTarget(type_=BY_REVISION, revision=old, percent=0, tag=PREVIOUS_TAG),
    ])  # fmt: skip
    again = promote(service, revision="dev", watch={"samples": 1, **SLO})
    assert again.outcome == "promoted" and again.serving_revision == new
    assert [step.step for step in again.delivery] == ["watch 100 %"]
    assert serving(flow_env, service) == [(new, 100, "")]  # the tag is gone: the old revision may scale to zero
