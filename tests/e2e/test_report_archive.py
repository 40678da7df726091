"""Each run's report kept in the target's bucket (reports/<service>/), where it outlives Prefect Cloud's 7-day
retention on the Hobby and Starter plans: written with the real google-cloud-storage client to the sandbox's Cloud
Storage, never over an earlier report, never with a secret in it, never failing the run; and a teardown touches only
its own service's reports, and only when asked."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import pytest
from prefect import flow
from prefect.blocks.system import Secret

from blocks import GcpTarget
from flows.teardown import teardown
from tasks.common import clients
from tasks.report.archive import archive_report, gcs_archive_report
from tasks.report.outcome import skipped_scale
from tasks.report.report import PromotionReport
from tests.support.promotion import promote
from tests.support.run_log import run_logs

pytestmark = pytest.mark.prefect
TOKEN = "hf_RecognizableArchiveToken5d1e8a03c7f9b2"
_ids = itertools.count()


@pytest.fixture(scope="module")
def promoted(sandbox, flow_env) -> PromotionReport:
    """A promotion of a gated model with a recognizable Hub token: the report a user would want kept."""
    sandbox.hub("POST", "/tokens", json={"token": TOKEN, "user": "archive-user"})
    sandbox.hub("POST", "/repos/sandbox/gated-chat/grants", json={"user": "archive-user"})
    Secret(value=TOKEN).save("archive-token", overwrite=True)
    report = promote("archive-chat", model="sandbox/gated-chat", token_secret_block="archive-token")
    assert report.outcome == "promoted", report.reason
    return report


@flow(name="archive-report")
def archived(target: GcpTarget, report: PromotionReport) -> str | None:
    """The archive task as a flow runs it (its run logger reaches the run's log)."""
    return gcs_archive_report(target, report)


def _objects(target: GcpTarget, prefix: str, bucket: str | None = None) -> dict[str, bytes]:
    storage = clients.storage(target)
    return {b.name: b.download_as_bytes() for b in storage.list_blobs(bucket or target.bucket_name, prefix=prefix)}


def test_a_promotion_report_lands_under_its_service_as_markdown_and_json(flow_env, promoted):
    url = archived(flow_env, promoted)
    prefix = f"gs://{flow_env.bucket_name}/reports/{promoted.service}/"
    assert url is not None and url.startswith(prefix) and url.endswith(".md") and "-promotion-" in url
    stem = url.removeprefix(f"gs://{flow_env.bucket_name}/").removesuffix(".md")
    objects = _objects(flow_env, stem)
    assert set(objects) == {f"{stem}.md", f"{stem}.json"}
    assert objects[f"{stem}.md"].decode() == promoted.markdown()  # what the artifact shows, word for word
    assert set(json.loads(objects[f"{stem}.json"])) == set(PromotionReport.model_fields)  # every field, its schema
    kept = PromotionReport.model_validate_json(objects[f"{stem}.json"])
    assert (kept.service, kept.outcome, kept.commit, kept.serving_revision) == (
        promoted.service, "promoted", promoted.commit, promoted.serving_revision,
    )  # fmt: skip


def test_a_second_report_of_the_same_run_and_second_is_kept_beside_the_first(flow_env, promoted):
    when = datetime.now(UTC)
    failed = promoted.model_copy(update={"outcome": "failed", "reason": "a second report"})

    @flow(name="archive-twice")
    def archive_twice() -> tuple[str, str]:  # one flow run: the same run id, and the same second
        return archive_report(flow_env, promoted, when), archive_report(flow_env, failed, when)

    first, second = archive_twice()
    assert first != second and second.removesuffix(".md").endswith("-2")
    names = _objects(flow_env, f"reports/{promoted.service}/")
    for url in (first, second):
        assert url.removeprefix(f"gs://{flow_env.bucket_name}/") in names
    assert names[first.removeprefix(f"gs://{flow_env.bucket_name}/")].decode() == promoted.markdown()  # untouched
    assert "a second report" in names[second.removeprefix(f"gs://{flow_env.bucket_name}/")].decode()


def test_no_secret_is_in_the_archived_objects(flow_env, promoted):
    url = archived(flow_env, promoted)
    assert url is not None
    stem = url.removeprefix(f"gs://{flow_env.bucket_name}/").removesuffix(".md")
    objects = _objects(flow_env, stem)
    assert len(objects) == 2 and promoted.commit and all(promoted.commit.encode() in data for data in objects.values())
    assert not [name for name, data in objects.items() if TOKEN.encode() in data]


def test_a_missing_permission_is_a_warning_naming_the_role_and_the_run_goes_on(sb, flow_env, promoted):
    before = set(_objects(flow_env, f"reports/{promoted.service}/"))

    @flow(name="archive-denied")
    def archive_denied() -> str:
        url = gcs_archive_report(flow_env, promoted)
        return f"done, archived: {url}"

    sb.set_caller_roles(["roles/storage.objectViewer"])  # may read the bucket, not create objects in it
    try:
        with run_logs() as log:
            state = archive_denied(return_state=True)
    finally:
        sb.set_caller_roles(["roles/owner"])
    assert state.is_completed() and state.result() == "done, archived: None"
    warning = next(line for line in log.lines if "not archived" in line)
    assert "storage.objects.create" in warning and "roles/storage.admin" in warning
    assert "gcloud projects add-iam-policy-binding" in warning and not log.errors
    assert set(_objects(flow_env, f"reports/{promoted.service}/")) == before  # nothing half-written


def test_a_teardown_deletes_only_its_own_reports_and_only_when_asked(flow_env):
    n = next(_ids)
    name = f"archive-td-{n}"
    gcp = GcpTarget.model_validate({**flow_env.model_dump(), "bucket": f"archive-td-{n}"})
    gcp.save(name, overwrite=True)
    clients.storage(gcp).create_bucket(gcp.bucket_name, location=gcp.region)
    mine, theirs = f"archive-mine-{n}", f"archive-theirs-{n}"
    for service in (mine, theirs):
        archive_report(gcp, skipped_scale(service, "nothing to scale"))

    teardown(service=mine, target=name, staged_weights=True)  # weights asked for, reports not: history stays
    assert _objects(gcp, f"reports/{mine}/") and _objects(gcp, f"reports/{theirs}/")

    results = teardown(service=mine, target=name, staged_weights=True, reports=True)
    actions = {r.kind: (r.action, " ".join(r.changes)) for r in results}
    assert actions["reports"][0] == "deleted" and not _objects(gcp, f"reports/{mine}/")
    assert len(_objects(gcp, f"reports/{theirs}/")) == 2  # another service's history: never this teardown's
    bucket_action, why = actions["bucket"]
    assert bucket_action == "kept" and f"run reports of {theirs}" in why and "reports" in why
    assert "staged for no service" not in why  # only reports are left: the message says so, not "weights"

    last = teardown(service=theirs, target=name, staged_weights=True, reports=True)
    assert {r.kind: r.action for r in last}["bucket"] == "deleted"
    assert clients.storage(gcp).lookup_bucket(gcp.bucket_name) is None
