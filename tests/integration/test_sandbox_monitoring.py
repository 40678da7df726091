"""Cloud Monitoring's timeSeries.list in the sandbox: Cloud Run metrics computed from requests really served.

One service, two revisions: the first answers, the second fails every chat completion (vLLM stand-in fault
``completions_status``). Requests go through the service URL with an ID token, as a user's client sends them; the
metrics are read back over HTTP with google-auth's AuthorizedSession, as the product reads them.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tasks.common import clients
from tests.support.identity import bearer
from tests.support.models import tiny_model_files, upload_model
from tests.support.sandbox_config import config_setter, sandbox_settings
from tests.support.services import SERVED_NAME, SMALLEST_L4, gpu_service

BUCKET = "monitoring-test-weights"
COUNT = "run.googleapis.com/request_count"
LATENCIES = "run.googleapis.com/request_latencies"
INSTANCES = "run.googleapis.com/container/instance_count"
CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
DAY = "86400s"  # one alignment period holds everything this module sends


@dataclass(frozen=True)
class Traffic:
    service_id: str
    good: str  # the revision that answers
    bad: str  # the revision whose chat completions fail
    sent: dict[tuple[str, str], int]  # (revision, response_code_class) -> requests that reached an instance


def short(name: str) -> str:
    return name.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def traffic(sandbox, sandbox_target) -> Iterator[Traffic]:
    """Deploy, send a known mix of requests to each revision, and remember what was sent. Both revisions' instances
    run at once: SMALLEST_L4 fits them in a new project's 40 GiB."""
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    # The weights bucket is granted with raw calls right before the deploys, which have no product wait for it.
    with sandbox_settings(sandbox, grant_propagation_seconds=0):
        upload_model(clients.storage(sandbox_target), BUCKET, "models/tiny", tiny_model_files())
        services = clients.run_services(sandbox_target)
        polling = clients.operation_polling(sandbox_target)
        service_id = f"mon-{uuid.uuid4().hex[:8]}"
        first = services.create_service(
            parent=sandbox_target.location_path, service=gpu_service(BUCKET, **SMALLEST_L4), service_id=service_id
        ).result(timeout=60, polling=polling)
        url = first.uri
        with httpx.Client(headers=bearer(url), timeout=30) as caller:
            for _ in range(5):
                assert caller.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 200
            assert caller.get(f"{url}/no-such-path").status_code == 404
            # No token: Cloud Run's front end refuses it before any instance sees it, so it is never counted.
            assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30).status_code == 403
            sandbox.run("POST", "/faults", json={"service": service_id, "faults": {"completions_status": 500}})
            second = services.update_service(
                service=run_v2.Service(gpu_service(BUCKET, **SMALLEST_L4, env={"ROLLOUT": "2"}), name=first.name)
            ).result(timeout=60, polling=polling)
            for _ in range(4):
                assert caller.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 500
            assert caller.get(f"{url}/v1/models").status_code == 200
        good, bad = short(first.latest_ready_revision), short(second.latest_ready_revision)
        assert good != bad
        sent = {(good, "2xx"): 5, (good, "4xx"): 1, (bad, "5xx"): 4, (bad, "2xx"): 1}
        yield Traffic(service_id, good, bad, sent)
        with contextlib.suppress(exceptions.NotFound):
            services.delete_service(name=first.name).result(polling=polling)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def list_series(
    target, metric: str, where: str = "", *, project: str | None = None, now: datetime | None = None, **params
) -> httpx.Response:
    """timeSeries.list over the hour before ``now`` as the product calls it (AuthorizedSession, query parameters)."""
    rest = clients.monitoring(target)
    now = now or datetime.now(UTC)
    query = {
        "filter": f'metric.type = "{metric}"' + (f" AND {where}" if where else ""),
        "interval.startTime": stamp(now - timedelta(hours=1)),
        "interval.endTime": stamp(now),
        "view": "FULL",
        **params,
    }
    return rest.session.get(rest.url(f"projects/{project or target.project}/timeSeries"), params=query, timeout=30)


def series_of(target, metric: str, where: str = "", **params) -> list[dict]:
    response = list_series(target, metric, where, **params)
    assert response.status_code == 200, response.text
    return response.json().get("timeSeries", [])


def error_of(response) -> dict:
    return {"code": response.status_code, **response.json()["error"]}


def counts_by_class(series: list[dict]) -> dict[tuple[str, str], int]:
    found: Counter = Counter()
    for s in series:
        key = (s["resource"]["labels"]["revision_name"], s["metric"]["labels"]["response_code_class"])
        found[key] += sum(int(p["value"]["int64Value"]) for p in s["points"])
    return dict(found)


def until(read: Callable[[], object], expected: object, seconds: float = 15.0) -> object:
    """Poll ``read`` until it returns ``expected`` or the deadline passes; returns the last value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def service_filter(traffic: Traffic) -> str:
    return f'resource.type = "cloud_run_revision" AND resource.labels.service_name = "{traffic.service_id}"'


# Raw series ----------------------------------------------------------------------------------------------------
def test_counts_per_class_per_revision_are_what_reached_the_instances(sandbox_target, traffic):
    read = lambda: counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic)))  # noqa: E731
    assert until(read, traffic.sent) == traffic.sent  # the refused request (403) is not among them


def test_raw_series_have_cloud_run_shapes(sandbox_target, traffic):
    until(lambda: counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic))), traffic.sent)
    where = f'{service_filter(traffic)} AND metric.labels.response_code = "500"'
    [count] = series_of(sandbox_target, COUNT, where)
    assert count["metric"] == {
        "type": COUNT,
        "labels": {"response_code": "500", "response_code_class": "5xx", "route_type": "default"},
    }
    assert count["resource"] == {
        "type": "cloud_run_revision",
        "labels": {
            "project_id": sandbox_target.project,
            "service_name": traffic.service_id,
            "revision_name": traffic.bad,
            "location": sandbox_target.region,
            "configuration_name": traffic.service_id,
        },
    }
    assert (count["metricKind"], count["valueType"], count["unit"]) == ("DELTA", "INT64", "1")
    ends = [p["interval"]["endTime"] for p in count["points"]]
    assert ends == sorted(ends, reverse=True)  # newest first
    [latency] = series_of(sandbox_target, LATENCIES, where)
    assert (latency["metricKind"], latency["valueType"], latency["unit"]) == ("DELTA", "DISTRIBUTION", "ms")
    assert latency["metric"]["labels"] == count["metric"]["labels"] and latency["resource"] == count["resource"]
    dists = [p["value"]["distributionValue"] for p in latency["points"]]
    assert sum(int(d["count"]) for d in dists) == 4
    for point, dist in zip(latency["points"], dists, strict=True):
        assert sum(int(n) for n in dist["bucketCounts"]) == int(dist["count"])
        assert dist["bucketOptions"]["exponentialBuckets"]["growthFactor"] > 1
        assert dist["mean"] > 0 and dist["sumOfSquaredDeviation"] >= 0
        assert point["interval"]["startTime"] < point["interval"]["endTime"]


def test_headers_view_and_pages(sandbox_target, traffic):
    until(lambda: counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic))), traffic.sent)
    headers = series_of(sandbox_target, COUNT, service_filter(traffic), view="HEADERS")
    assert len(headers) == 4 and not any("points" in s for s in headers)
    paged, token, now = [], "", datetime.now(UTC)  # every page of one query asks for the same interval
    while True:
        response = list_series(sandbox_target, COUNT, service_filter(traffic), now=now, view="HEADERS", pageSize=1,
                               **({"pageToken": token} if token else {}))  # fmt: skip
        assert response.status_code == 200, response.text
        body = response.json()
        paged += body["timeSeries"]
        token = body.get("nextPageToken", "")
        if not token:
            break
    assert paged == headers
    first = list_series(sandbox_target, COUNT, service_filter(traffic), now=now, view="HEADERS", pageSize=1)
    # A page token belongs to its query: asking for another view with it is refused.
    other_view = {"view": "FULL", "pageSize": 1, "pageToken": first.json()["nextPageToken"]}
    assert list_series(sandbox_target, COUNT, service_filter(traffic), now=now, **other_view).status_code == 400


def test_instance_count_reports_the_running_revision(sandbox_target, traffic):
    where = f'{service_filter(traffic)} AND resource.labels.revision_name = "{traffic.bad}"'
    read = lambda: [s["metric"]["labels"] for s in series_of(sandbox_target, INSTANCES, where)]  # noqa: E731
    assert until(read, [{"state": "active"}]) == [{"state": "active"}]
    [series] = series_of(sandbox_target, INSTANCES, where)
    assert (series["metricKind"], series["valueType"]) == ("GAUGE", "INT64")
    assert {p["value"]["int64Value"] for p in series["points"]} == {"1"}


# Visibility ----------------------------------------------------------------------------------------------------
def test_points_stay_invisible_until_the_delay_has_passed(sandbox, sandbox_target, traffic):
    total = sum(traffic.sent.values())
    read = lambda: sum(counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic))).values())  # noqa: E731
    assert until(read, total) == total
    with config_setter(sandbox, "monitoring_delay_seconds") as set_delay:
        set_delay(10**7)  # far longer than this session has been running
        assert read() == 0
        set_delay(0)
        assert until(read, total) == total


# Aggregation ---------------------------------------------------------------------------------------------------
def test_align_delta_and_reduce_sum_by_response_code_class(sandbox_target, traffic):
    until(lambda: counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic))), traffic.sent)
    reduced = series_of(
        sandbox_target, COUNT, service_filter(traffic),
        **{"aggregation.perSeriesAligner": "ALIGN_DELTA", "aggregation.alignmentPeriod": DAY,
           "aggregation.crossSeriesReducer": "REDUCE_SUM",
           "aggregation.groupByFields": ["metric.labels.response_code_class"]},
    )  # fmt: skip
    by_class = {s["metric"]["labels"]["response_code_class"]: s for s in reduced}
    expected: Counter = Counter()
    for (_, code_class), n in traffic.sent.items():
        expected[code_class] += n
    assert {k: [p["value"]["int64Value"] for p in s["points"]] for k, s in by_class.items()} == {
        k: [str(n)] for k, n in expected.items()
    }
    assert all(s["resource"] == {"type": "cloud_run_revision", "labels": {"project_id": sandbox_target.project}}
               for s in reduced)  # fmt: skip
    per_revision = series_of(
        sandbox_target, COUNT, service_filter(traffic),
        **{"aggregation.perSeriesAligner": "ALIGN_DELTA", "aggregation.alignmentPeriod": DAY,
           "aggregation.crossSeriesReducer": "REDUCE_SUM",
           "aggregation.groupByFields": ["resource.labels.revision_name", "metric.labels.response_code_class"]},
    )  # fmt: skip
    assert {
        (s["resource"]["labels"]["revision_name"], s["metric"]["labels"]["response_code_class"]): int(
            s["points"][0]["value"]["int64Value"]
        )
        for s in per_revision
    } == traffic.sent


def test_percentiles_of_latencies(sb, sandbox_target, traffic):
    until(lambda: counts_by_class(series_of(sandbox_target, COUNT, service_filter(traffic))), traffic.sent)
    where = f'{service_filter(traffic)} AND resource.labels.revision_name = "{traffic.good}"'
    values = {}
    for p in ("50", "95", "99"):
        [series] = series_of(
            sandbox_target, LATENCIES, where + ' AND metric.labels.response_code_class = "2xx"',
            **{"aggregation.perSeriesAligner": f"ALIGN_PERCENTILE_{p}", "aggregation.alignmentPeriod": DAY},
        )  # fmt: skip
        assert (series["metricKind"], series["valueType"]) == ("GAUGE", "DOUBLE")
        [point] = series["points"]
        assert point["interval"]["startTime"] == point["interval"]["endTime"]
        values[p] = point["value"]["doubleValue"]
    assert 0 < values["50"] <= values["95"] <= values["99"]
    # The stand-in's own record of those requests (simulated ms): the percentiles lie within their range, give or
    # take one bucket (growth factor 1.1).
    recorded = [e["latency_ms"] for e in sb.admin.get("/monitoring/events", params={"service": traffic.service_id})
                .json() if e["revision"] == traffic.good and e["code"] == 200]  # fmt: skip
    assert len(recorded) == 5
    assert min(recorded) / 1.1 <= values["50"] and values["99"] <= max(recorded) * 1.1
    reduced = series_of(
        sandbox_target, LATENCIES, service_filter(traffic),
        **{"aggregation.perSeriesAligner": "ALIGN_DELTA", "aggregation.alignmentPeriod": DAY,
           "aggregation.crossSeriesReducer": "REDUCE_PERCENTILE_95",
           "aggregation.groupByFields": ["resource.labels.revision_name"]},
    )  # fmt: skip
    assert {s["resource"]["labels"]["revision_name"] for s in reduced} == {traffic.good, traffic.bad}
    assert all(s["valueType"] == "DOUBLE" and s["points"][0]["value"]["doubleValue"] > 0 for s in reduced)


# Refusals ------------------------------------------------------------------------------------------------------
def test_alignment_needs_a_period_of_at_least_a_minute(sandbox_target, traffic):
    short_period = list_series(sandbox_target, COUNT, **{"aggregation.perSeriesAligner": "ALIGN_DELTA",
                                                         "aggregation.alignmentPeriod": "30s"})  # fmt: skip
    assert error_of(short_period) == {
        "code": 400,
        "status": "INVALID_ARGUMENT",
        "message": 'Field aggregation.alignmentPeriod had an invalid value of "30s": The alignment period must be '
        "greater than or equal to 1 minute.",
    }
    assert list_series(sandbox_target, COUNT, **{"aggregation.perSeriesAligner": "ALIGN_SUM"}).status_code == 400
    rate = list_series(sandbox_target, LATENCIES, **{"aggregation.perSeriesAligner": "ALIGN_RATE",
                                                     "aggregation.alignmentPeriod": "60s"})  # fmt: skip
    assert error_of(rate)["message"] == (
        'Field aggregation.perSeriesAligner had an invalid value of "ALIGN_RATE": The aligner cannot be applied to '
        "metrics with kind DELTA and value type DISTRIBUTION."
    )
    reducer_alone = list_series(sandbox_target, COUNT, **{"aggregation.crossSeriesReducer": "REDUCE_SUM"})
    assert error_of(reducer_alone)["code"] == 400


def test_bad_filters_and_intervals_are_refused(sandbox_target):
    rest = clients.monitoring(sandbox_target)
    url = rest.url(f"projects/{sandbox_target.project}/timeSeries")
    end = stamp(datetime.now(UTC))
    no_type = rest.session.get(url, params={"filter": 'resource.type = "cloud_run_revision"', "interval.endTime": end})
    assert error_of(no_type)["code"] == 400
    assert error_of(no_type)["message"].startswith("Field filter had an invalid value of")
    unknown = rest.session.get(
        url, params={"filter": 'metric.type = "run.googleapis.com/nope"', "interval.endTime": end}
    )
    assert error_of(unknown)["code"] == 404
    assert 'Cannot find metric(s) that match type = "run.googleapis.com/nope"' in error_of(unknown)["message"]
    no_end = rest.session.get(url, params={"filter": f'metric.type = "{COUNT}"'})
    assert error_of(no_end)["message"] == "Request was missing field interval.endTime."
    later = stamp(datetime.now(UTC) + timedelta(minutes=5))
    backwards = rest.session.get(url, params={"filter": f'metric.type = "{COUNT}"', "interval.endTime": end,
                                              "interval.startTime": later})  # fmt: skip
    assert error_of(backwards)["code"] == 400


def test_another_project_or_a_missing_role_is_denied(sandbox, sandbox_target):
    other = list_series(sandbox_target, COUNT, project="someone-elses-project")
    assert error_of(other)["code"] == 403
    assert error_of(other)["message"] == "Permission monitoring.timeSeries.list denied (or the resource may not exist)."
    with sandbox.caller_roles(["roles/run.viewer"]):
        denied = list_series(sandbox_target, COUNT)
    assert error_of(denied)["status"] == "PERMISSION_DENIED"
    assert error_of(denied)["details"][0]["metadata"]["permission"] == "monitoring.timeSeries.list"
    with sandbox.caller_roles(["roles/monitoring.viewer"]):
        assert list_series(sandbox_target, COUNT).status_code == 200


def test_a_disabled_monitoring_api_answers_service_disabled(sandbox, sandbox_target):
    with config_setter(sandbox, "disabled_apis") as set_disabled:
        set_disabled(["monitoring.googleapis.com"])
        refused = list_series(sandbox_target, COUNT)
    assert error_of(refused)["code"] == 403
    assert error_of(refused)["details"][0]["reason"] == "SERVICE_DISABLED"
    assert "Cloud Monitoring API has not been used in project" in error_of(refused)["message"]
