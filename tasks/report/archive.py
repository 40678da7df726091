"""A run's report kept in the target's bucket, where it outlives the Prefect plan's retention.

Prefect Cloud's Hobby and Starter plans keep flow runs, task runs and artifacts 7 days (Team 14, Pro 30) from when a
run ends ("Rate limits and data retention", https://docs.prefect.io/v3/concepts/rate-limits): a promotion's report
artifact is gone a week later. Each report is therefore also written to the bucket the weights are staged in, as

    gs://BUCKET/reports/<service>/<UTC time>-<kind>-<run>.md    the markdown the artifact shows
    gs://BUCKET/reports/<service>/<UTC time>-<kind>-<run>.json  the report's fields (PromotionReport, Outcome)

``<kind>`` is promotion, rollback or scale, ``<run>`` the first 8 characters of the flow run's id. Names sort by
time, so ``gcloud storage ls gs://BUCKET/reports/SERVICE/`` lists a service's history in order. Neither report model
holds a secret: the Hub token is read inside its tasks and never stored on a report (tests/integration/
test_report_archive.py checks the objects for the token's value).

Archiving never decides a run's outcome: a failure to write (a missing role, an outage) is a WARNING naming the fix,
and the run goes on with its report still in its artifact.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from google.api_core import exceptions as gexc
from prefect import task
from prefect.runtime import flow_run

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import explain_forbidden
from tasks.common.logs import run_logger
from tasks.common.naming import reports_prefix
from tasks.report.outcome import Outcome
from tasks.report.report import PromotionReport

# Two runs of one service never write in the same second under the service lock; a name taken anyway (the same run
# archiving twice in a second) gets a suffix instead of overwriting (ifGenerationMatch=0: create only).
MAX_NAME_TRIES = 5


# A run's report: its service, its markdown (the artifact's text), its fields as JSON.
Archivable = PromotionReport | Outcome


def report_kind(report: Archivable) -> str:
    """promotion for a PromotionReport; an Outcome's own kind (scale, rollback)."""
    return report.kind if isinstance(report, Outcome) else "promotion"


def report_stem(report: Archivable, when: datetime, run_id: str | None) -> str:
    """The object name without its extension: reports/<service>/<UTC time>-<kind>-<run>."""
    run = (run_id or uuid.uuid4().hex).replace("-", "")[:8]  # outside a flow run: a random id, never a collision
    return f"{reports_prefix(report.service)}{when.astimezone(UTC):%Y%m%dT%H%M%SZ}-{report_kind(report)}-{run}"


def archive_report(target: GcpTarget, report: Archivable, when: datetime | None = None) -> str:
    """Write the report's markdown and JSON under reports/<service>/ in the target's bucket; the markdown's gs:// URL.

    Raises what Cloud Storage raises (403, 404 for a missing bucket): ``gcs_archive_report`` turns it into a warning."""
    bucket = clients.storage(target).bucket(target.bucket_name)
    stem = report_stem(report, when or datetime.now(UTC), flow_run.id)
    markdown, document = report.markdown().encode(), report.model_dump_json(indent=2).encode()
    for attempt in range(MAX_NAME_TRIES):
        name = stem if attempt == 0 else f"{stem}-{attempt + 1}"
        try:  # create only: an archived report is never replaced
            bucket.blob(f"{name}.md").upload_from_string(
                markdown, content_type="text/markdown; charset=utf-8", if_generation_match=0
            )
        except gexc.PreconditionFailed:
            continue
        bucket.blob(f"{name}.json").upload_from_string(document, content_type="application/json", if_generation_match=0)
        return f"gs://{target.bucket_name}/{name}.md"
    raise FileExistsError(f"gs://{target.bucket_name}/{stem}.md and {MAX_NAME_TRIES - 1} suffixed names are taken")


def why_not_archived(exc: Exception, target: GcpTarget, what: str) -> str:
    """The reason and the fix, for the warning."""
    if isinstance(exc, (gexc.Forbidden, gexc.PermissionDenied)):
        return str(explain_forbidden(exc, "storage", "roles/storage.admin", what, target.project,
                                     clients.principal(target)))  # fmt: skip
    if isinstance(exc, gexc.NotFound):
        return (f"{what}: the bucket gs://{target.bucket_name} does not exist (GcpTarget.bucket); a promotion "
                "creates it in its infrastructure step")  # fmt: skip
    return f"{what}: {type(exc).__name__}: {exc}; the next run archives its own report"


@task(name="gcs_archive_report")
def gcs_archive_report(target: GcpTarget, report: Archivable) -> str | None:
    """The report kept in the target's bucket (reports/<service>/...), beyond Prefect's retention; its gs:// URL.

    None when it could not be written: the run's outcome stands, and a WARNING says why and what to fix."""
    what = f"archiving the {report_kind(report)} report of {report.service} in gs://{target.bucket_name}"
    try:
        url = archive_report(target, report)
    except Exception as exc:  # the run's own outcome is what matters; the report is still its artifact
        run_logger().warning("the report was not archived (the run goes on, its artifact holds the report): %s",
                             why_not_archived(exc, target, what))  # fmt: skip
        return None
    run_logger().info("report archived: %s (read it with `gcloud storage cat %s`)", url, url)
    return url
