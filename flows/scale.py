"""scale-service: set a service's min (and max) instances, e.g. 1 in business hours and 0 at night (lesson 16)."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow
from prefect.context import FlowRunContext
from prefect.runtime import deployment, flow_run

from blocks.target import GcpTarget
from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.checks.quotas import run_check_scale_quota
from tasks.common.gcp import InfraError
from tasks.deploy.cloudrun import Scaling, run_scale_service
from tasks.report.archive import gcs_archive_report
from tasks.report.outcome import publish, run_read_service, scale_outcome, skipped_scale
from tasks.report.schedules import late_scale_up, promote_command


def started_by_schedule() -> str | None:
    """The slug of the deployment schedule that created this run; None for a run started any other way (by hand,
    through the API, by an automation, or the flow called directly)."""
    # The signal is the run's `created_by`. Prefect 3.9.1's server sets it to {"type": "SCHEDULE", "id": <schedule
    # id>, "display_value": <slug>} on every run it makes from a deployment schedule (server/models/deployments.py,
    # _generate_scheduled_flow_runs, behind both the scheduler service and POST /deployments/{id}/schedule), and takes
    # it from no client (server/api/dependencies.py, get_created_by: only an automation's run, as AUTOMATION). Not
    # `scheduled_start_time`: every run has one (`prefect deployment run` schedules it for now); not the
    # `auto-scheduled` tag, which anyone may put on a run. prefect.runtime.flow_run does not expose created_by; the
    # run context holds the run as the engine read it from the API (flow_engine.py, setup_run_context).
    context = FlowRunContext.get()
    created_by = context.flow_run.created_by if context and context.flow_run else None
    if created_by is None or created_by.type != "SCHEDULE":
        return None
    return created_by.display_value or str(created_by.id)  # its slug (the server writes its class name if none)


def not_promoted(gcp: GcpTarget, service: str) -> str:
    """Why a schedule's run of a service that does not exist yet did nothing, and the command that promotes it."""
    return (
        f"no Cloud Run service '{service}' in {gcp.project}/{gcp.region}; promote it first: "
        f"{promote_command(deployment.name, service)}"
    )


@flow(name="scale-service", log_prints=True)
def scale_service(
    service: str,
    min_instances: int,
    max_instances: int | None = None,
    target: str = DEFAULT_TARGET,
    gpu_quota: int | None = None,
    warm_until: str | None = None,
    timezone: str = "UTC",
) -> Scaling | None:
    """Set a service's min (0 = scale to zero) and optionally max instances; traffic and revisions are left alone.

    A no-op when the service is already there. The schedules in prefect.yaml run it to keep one instance warm in
    business hours and let the service scale to zero outside them. Each run ends with one outcome line (min and max
    before and after, traffic, URL) and the artifact `scale-<service>` with the same facts, also kept in the target's
    bucket under reports/<service>/ (tasks/report/archive.py; a run that did nothing on purpose is not kept).

    A run a schedule started for a service not promoted yet completes without changes, saying "not promoted yet" and
    how to promote it; started by hand, the same run fails naming the service. Chosen over keeping the schedules
    paused until the first promotion: a schedule that promote-model must resume couples the two flows (a promotion
    would have to find the schedules of its service, and a redeploy would pause them again), while a run that finds
    nothing to scale costs one read and says plainly why it did nothing.

    Args:
        service: The Cloud Run service to scale, e.g. gemma-4-e2b (a model file's `service:`).
        min_instances: Instances kept running: 1 or more keeps a GPU warm (billed while it runs), 0 scales to zero.
        max_instances: The most instances; empty keeps the service's. Their GPUs must fit the region's GPU quota.
        target: The GcpTarget block that names the project and region (bootstrap saves `production`).
        gpu_quota: The project's GPU quota in the region, used only when Service Usage cannot be read: the quota
            read from Google decides whenever it can be read (a raised one needs no repeating here); with neither, a
            new project's default (3 L4, 1 RTX Pro 6000) is assumed. `max_instances` is checked against it.
        warm_until: HH:MM in `timezone`, set by the schedules' scale-up: a scale-up that runs after that day's warm
            hours (its worker was down) does nothing, so no GPU starts at night.
        timezone: The IANA time zone of `warm_until`, e.g. Europe/Berlin.
    """
    if warm_until is not None and min_instances > 0:
        late = late_scale_up(flow_run.get_scheduled_start_time(), datetime.now(UTC), warm_until, timezone)
        if late is not None:
            publish(skipped_scale(service, late))
            return None
    gcp = load_target(target)
    schedule = started_by_schedule()
    # Read under the lock: a scheduled scale-up due during the first promotion waits for it, then finds the service.
    with service_lock(gcp, service):
        before = run_read_service(gcp, service)
        if before is None and schedule is not None:
            publish(skipped_scale(service, f"not promoted yet, nothing to scale (schedule {schedule}); "
                                           f"{not_promoted(gcp, service)}"))  # fmt: skip
            return None
        if before is None:
            raise InfraError(f"service: {not_promoted(gcp, service)}, or check the name (`gcloud run services list`)")
        # The GPU quota figure promote-model's preflight judges by (tasks/checks/quotas.py): Cloud Run itself would
        # take a maximum over it, and the instances above it would never start.
        run_check_scale_quota(gcp, service, max_instances, gpu_quota)
        result = run_scale_service(gcp, service, min_instances, max_instances)
    if result.changed:
        emit("service.scaled", gcp, service, {"min_instances": min_instances, "max_instances": result.max_instances})
    outcome = scale_outcome(gcp, before, min_instances, result.max_instances, result.changed)
    publish(outcome)
    gcs_archive_report(gcp, outcome)  # kept in the bucket past Prefect's retention; a failure is only a warning
    return result
