"""rollback-model: all traffic back to the previous ready revision, or to a named one."""

from __future__ import annotations

from prefect import flow

from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.deploy.cloudrun import Rollback, run_rollback
from tasks.report.archive import gcs_archive_report
from tasks.report.outcome import publish, rollback_outcome, run_read_service


@flow(name="rollback-model", log_prints=True)
def rollback_model(
    service: str, to_revision: str | None = None, target: str = DEFAULT_TARGET, force: bool = False
) -> Rollback:
    """Move 100 % of the service's traffic to ``to_revision``, or to the newest revision before the current one that
    passed verification. A revision a promotion found bad (failed verification, rolled back after an SLO breach)
    stays Ready in Cloud Run: it is never chosen, and naming it needs ``force``. The revision rolled back from is
    recorded as rolled back.

    Staged weights stay in the bucket per commit, so the older revision serves its own weights again. The run ends
    with one outcome line (traffic before and after, URL) and the artifact `rollback-<service>` with the same facts,
    also kept in the target's bucket under reports/<service>/ (tasks/report/archive.py).

    Args:
        service: The Cloud Run service whose traffic moves back, e.g. gemma-4-e2b.
        to_revision: The revision to send all traffic to; empty for the newest earlier one that passed verification.
        target: The GcpTarget block that names the project and region (bootstrap saves `production`).
        force: Allow a `to_revision` a promotion found bad (failed verification, rolled back).
    """
    gcp = load_target(target)
    with service_lock(gcp, service):
        result = run_rollback(gcp, service, to_revision, force)
        after = run_read_service(gcp, service)  # what Cloud Run serves now, under the lock that moved it
    emit("model.rolled_back", gcp, service, {"from": result.from_revision, "to": result.to_revision})
    outcome = rollback_outcome(gcp, service, after, result.from_revision, result.to_revision)
    publish(outcome)
    gcs_archive_report(gcp, outcome)  # kept in the bucket past Prefect's retention; a failure is only a warning
    return result
