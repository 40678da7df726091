"""Revision logs through the Cloud Logging stand-in: the product's tail, and entries.list as the REST API answers it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from google.api_core import exceptions
from google.cloud import run_v2
from google.protobuf import timestamp_pb2

from tasks.common import clients
from tasks.common.gcp import InfraError
from tasks.deploy.revision_logs import revision_filter, revision_log_tail
from tests.support.models import tiny_model_files, upload_model
from tests.support.sandbox_config import sandbox_settings
from tests.support.services import SMALLEST_L4, gpu_service, vllm_args

BUCKET = "revision-logs-test-weights"
STARTUP = ("Started server process", "Waiting for application startup.", "Application startup complete.")
SHELL_ERROR = "serve: command not found"


@dataclass(frozen=True)
class Deployed:
    service_id: str
    healthy: str  # a revision that started and serves
    failed: str  # a later revision of the same service whose container never started


def short(name: str) -> str:
    return name.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def deployed(sandbox, sandbox_target) -> Iterator[Deployed]:
    """One service with a healthy revision, then a revision that fails at start (Model Garden without `vllm`). The
    failing revision's instance starts beside the healthy one's: SMALLEST_L4 fits both in a new project's 40 GiB."""
    sandbox.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    # The weights bucket is granted with raw calls right before the deploys, which have no product wait for it.
    with sandbox_settings(sandbox, grant_propagation_seconds=0):
        upload_model(clients.storage(sandbox_target), BUCKET, "models/tiny", tiny_model_files())
        services = clients.run_services(sandbox_target)
        service_id = f"logs-{uuid.uuid4().hex[:8]}"
        polling = clients.operation_polling(sandbox_target)
        first = services.create_service(
            parent=sandbox_target.location_path, service=gpu_service(BUCKET, **SMALLEST_L4), service_id=service_id
        ).result(timeout=60, polling=polling)
        broken = run_v2.Service(gpu_service(BUCKET, **SMALLEST_L4, args=vllm_args()[1:]), name=first.name)
        with pytest.raises(exceptions.GoogleAPICallError, match="is not ready and cannot serve traffic") as refused:
            services.update_service(service=broken).result(timeout=60, polling=polling)
        assert "The user-provided container failed" in refused.value.message  # its container's failure, not a quota
        after = services.get_service(name=first.name)
        # Cloud Run's idle time passes now rather than while a test reads the log: the instance stops (its shutdown
        # lines written) before the tests compare one read of the healthy revision's log with another.
        sandbox.run("POST", "/idle")
        yield Deployed(service_id, short(first.latest_ready_revision), short(after.latest_created_revision))
        with contextlib.suppress(exceptions.NotFound):
            services.delete_service(name=first.name).result(polling=polling)


def file_lines(sb, revision: str) -> list[str]:
    """The revision's log as its Logs URL shows it (the sandbox's admin API): its container's lines and Cloud Run's."""
    return [line for line in sb.admin.get(f"/run/logs/{revision}").text.splitlines() if line.strip()]


def is_contiguous_run(part: list[str], whole: list[str]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def list_entries(target, **body) -> dict:
    rest = clients.logging_api(target)
    response = rest.session.post(
        rest.url("entries:list"), json={"resourceNames": [f"projects/{target.project}"], **body}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()


def list_error(target, **body) -> dict:
    rest = clients.logging_api(target)
    response = rest.session.post(rest.url("entries:list"), json=body, timeout=30)
    return {"code": response.status_code, **response.json()["error"]}


def nanos(stamp: str) -> int:
    parsed = timestamp_pb2.Timestamp()
    parsed.FromJsonString(stamp)
    return parsed.ToNanoseconds()


# The product's tail ------------------------------------------------------------------------------------------
def test_a_revision_that_fails_at_start_ends_with_its_cause(sb, sandbox_target, deployed):
    tail = revision_log_tail(sandbox_target, deployed.service_id, deployed.failed)
    assert tail[-1] == SHELL_ERROR
    assert tail == file_lines(sb, deployed.failed)[-40:]


def test_a_healthy_revision_tail_has_vllm_startup_in_order(sb, sandbox_target, deployed):
    tail = revision_log_tail(sandbox_target, deployed.service_id, deployed.healthy, lines=200)
    positions = [next(i for i, line in enumerate(tail) if marker in line) for marker in STARTUP]
    assert positions == sorted(positions)
    assert is_contiguous_run(tail, file_lines(sb, deployed.healthy))


def test_lines_bounds_the_tail_to_the_newest_lines(sb, sandbox_target, deployed):
    whole = file_lines(sb, deployed.healthy)
    assert len(whole) > 5
    assert revision_log_tail(sandbox_target, deployed.service_id, deployed.healthy, lines=5) == whole[-5:]
    assert len(revision_log_tail(sandbox_target, deployed.service_id, deployed.healthy)) == min(40, len(whole))
    assert revision_log_tail(sandbox_target, deployed.service_id, deployed.healthy, lines=0) == []


def test_revisions_of_one_service_do_not_mix(sandbox_target, deployed):
    healthy = revision_log_tail(sandbox_target, deployed.service_id, deployed.healthy, lines=1000)
    failed = revision_log_tail(sandbox_target, deployed.service_id, deployed.failed, lines=1000)
    assert SHELL_ERROR not in healthy
    assert not any(STARTUP[-1] in line for line in failed)
    assert any(STARTUP[-1] in line for line in healthy)


def test_no_logs_is_an_empty_tail_not_an_error(sandbox_target, deployed):
    assert revision_log_tail(sandbox_target, deployed.service_id, f"{deployed.service_id}-00099-zzz") == []
    assert revision_log_tail(sandbox_target, "logs-never-deployed", "logs-never-deployed-00001-abc") == []


def test_a_denied_read_names_the_role_to_grant(sb, sandbox_target, deployed):
    sb.add_fault("control", path="entries:list", status=403, times=1)
    with pytest.raises(InfraError, match=r"roles/logging\.viewer") as caught:
        revision_log_tail(sandbox_target, deployed.service_id, deployed.failed)
    assert deployed.failed in str(caught.value)


def test_a_transient_error_is_retried(sb, sandbox_target, deployed):
    sb.add_fault("control", path="entries:list", status=503, times=1)
    assert revision_log_tail(sandbox_target, deployed.service_id, deployed.failed)[-1] == SHELL_ERROR
    assert [r["status"] for r in sb.requests("control") if r["path"].endswith("entries:list")][-2:] == [503, 200]


# entries.list as the REST API answers it ---------------------------------------------------------------------
def test_entries_are_shaped_as_cloud_run_container_logs(sandbox_target, deployed):
    body = list_entries(sandbox_target, filter=revision_filter(sandbox_target, deployed.service_id, deployed.failed))
    assert "nextPageToken" not in body
    entry = body["entries"][-1]
    assert entry["textPayload"] == SHELL_ERROR
    assert entry["resource"] == {
        "type": "cloud_run_revision",
        "labels": {
            "service_name": deployed.service_id,
            "revision_name": deployed.failed,
            "location": sandbox_target.region,
            "configuration_name": deployed.service_id,
            "project_id": sandbox_target.project,
        },
    }
    # A shell error goes to stderr, which Cloud Run logs at ERROR.
    assert entry["logName"] == f"projects/{sandbox_target.project}/logs/run.googleapis.com%2Fstderr"
    assert entry["severity"] == "ERROR"
    assert entry["labels"]["instanceId"]
    assert nanos(entry["receiveTimestamp"]) >= nanos(entry["timestamp"])


def test_healthy_revision_entries_are_in_time_order_with_unique_ids(sandbox_target, deployed):
    wanted = revision_filter(sandbox_target, deployed.service_id, deployed.healthy)
    ascending = list_entries(sandbox_target, filter=wanted, pageSize=1000)["entries"]
    stamps = [nanos(e["timestamp"]) for e in ascending]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert len({e["insertId"] for e in ascending}) == len(ascending)
    # vLLM logs to stdout (DEFAULT severity), uvicorn's start-up lines go to stderr (ERROR, as Cloud Run rates any).
    server = next(e for e in ascending if "Starting vLLM server on" in e["textPayload"])
    assert (server["logName"].endswith("run.googleapis.com%2Fstdout"), server["severity"]) == (True, "DEFAULT")
    startup = next(e for e in ascending if STARTUP[-1] in e["textPayload"])
    assert (startup["logName"].endswith("run.googleapis.com%2Fstderr"), startup["severity"]) == (True, "ERROR")
    descending = list_entries(sandbox_target, filter=wanted, pageSize=1000, orderBy="timestamp desc")["entries"]
    assert [e["insertId"] for e in descending] == [e["insertId"] for e in reversed(ascending)]


def test_filters_select_severity_time_and_joined_clauses(sandbox_target, deployed):
    service = f'resource.labels.service_name="{deployed.service_id}"'
    errors = list_entries(sandbox_target, filter=f"{service} AND severity>=ERROR", pageSize=1000)["entries"]
    assert SHELL_ERROR in [e["textPayload"] for e in errors]
    assert {e["severity"] for e in errors} == {"ERROR"}
    # Keyword AND, newlines and bare values all join clauses the same way.
    spelled = [
        f'resource.type="cloud_run_revision" AND {service} AND resource.labels.revision_name="{deployed.healthy}"',
        f"resource.type=cloud_run_revision\n{service}\nresource.labels.revision_name={deployed.healthy}",
    ]
    found = [list_entries(sandbox_target, filter=text, pageSize=1000)["entries"] for text in spelled]
    assert found[0] == found[1] and found[0]
    half = len(found[0]) // 2
    since = f'{spelled[0]} AND timestamp>="{found[0][half]["timestamp"]}"'
    assert list_entries(sandbox_target, filter=since, pageSize=1000)["entries"] == found[0][half:]


def test_pages_follow_each_other_without_gaps_or_repeats(sandbox_target, deployed):
    wanted = revision_filter(sandbox_target, deployed.service_id, deployed.healthy)
    for order in ("timestamp asc", "timestamp desc"):
        whole = list_entries(sandbox_target, filter=wanted, orderBy=order, pageSize=1000)["entries"]
        paged, token, pages = [], "", 0
        while True:
            body = list_entries(sandbox_target, filter=wanted, orderBy=order, pageSize=4, pageToken=token)
            paged += body.get("entries", [])
            pages += 1
            token = body.get("nextPageToken", "")
            if not token:
                break
        assert [e["insertId"] for e in paged] == [e["insertId"] for e in whole]
        assert pages == -(-len(whole) // 4)
    first = list_entries(sandbox_target, filter=wanted, pageSize=4)
    assert len(first["entries"]) == 4
    other_query = list_error(
        sandbox_target,
        resourceNames=[f"projects/{sandbox_target.project}"],
        filter=wanted,
        orderBy="timestamp desc",
        pageToken=first["nextPageToken"],
    )
    assert other_query["code"] == 400 and other_query["status"] == "INVALID_ARGUMENT"


def test_page_size_defaults_to_50(sandbox_target):
    body = list_entries(sandbox_target, filter='resource.type="cloud_run_revision"')
    assert len(body["entries"]) <= 50
    if len(body["entries"]) == 50:
        assert body["nextPageToken"]


@pytest.mark.parametrize(
    ("filter_text", "named"),
    [
        ('textPayload:"serve"', 'textPayload:"serve"'),
        ('resource.type="cloud_run_revision" OR severity>=ERROR', "OR severity>=ERROR"),
        ('resource.type="cloud_run_revision" and severity>=ERROR', "and severity>=ERROR"),
        ("NOT severity>=ERROR", "NOT severity>=ERROR"),
        ('jsonPayload.message="x"', 'jsonPayload.message="x"'),
        ('resource.labels.service_name!="x"', 'resource.labels.service_name!="x"'),
        ('(resource.type="cloud_run_revision")', '(resource.type="cloud_run_revision")'),
    ],
)
def test_an_unsupported_filter_clause_is_a_400_naming_it(sandbox_target, filter_text, named):
    error = list_error(sandbox_target, resourceNames=[f"projects/{sandbox_target.project}"], filter=filter_text)
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert f"'{named}'" in error["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"resourceNames": ["projects/someone-elses-project"]}, 403),
        ({}, 400),
        ({"resourceNames": ["organizations/1234"]}, 400),
        ({"pageSize": 1001}, 400),
        ({"orderBy": "severity desc"}, 400),
        ({"pageToken": "not-a-token"}, 400),
        ({"filter": 'timestamp>="yesterday"'}, 400),
    ],
    ids=["other-project", "no-resource", "organization", "page-too-big", "order-by", "bad-token", "bad-time"],
)
def test_requests_the_api_refuses(sandbox_target, body, code):
    project = {"resourceNames": [f"projects/{sandbox_target.project}"]}
    error = list_error(sandbox_target, **({**project, **body} if body else {}))
    assert error["code"] == code
    assert error["status"] == ("PERMISSION_DENIED" if code == 403 else "INVALID_ARGUMENT")
