"""rollback-model: all traffic back to the previous ready revision, or to a named one."""

from __future__ import annotations

from prefect import flow

from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.cloudrun import Rollback, run_rollback


@flow(name="rollback-model", log_prints=True)
def rollback_model(
    service: str, to_revision: str | None = None, target: str = DEFAULT_TARGET, force: bool = False
) -> Rollback:
    """Move 100 % of the service's traffic to ``to_revision``, or to the newest revision before the current one that
    passed verification. A revision a promotion found bad (failed verification, rolled back after an SLO breach)
    stays Ready in Cloud Run: it is never chosen, and naming it needs ``force``. The revision rolled back from is
    recorded as rolled back.

    Staged weights stay in the bucket per commit, so the older revision serves its own weights again.
    """
    gcp = load_target(target)
    with service_lock(gcp, service):
        result = run_rollback(gcp, service, to_revision, force)
    emit("model.rolled_back", gcp, service, {"from": result.from_revision, "to": result.to_revision})
    print(f"{service}: traffic moved from {result.from_revision} to {result.to_revision}")
    return result
