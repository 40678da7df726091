"""scale-service: set a service's min (and max) instances, e.g. 1 in business hours and 0 at night (lesson 16)."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow
from prefect.runtime import flow_run

from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.cloudrun import Scaling, run_scale_service
from tasks.schedules import late_scale_up


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
    """Set min (0 = scale to zero) and optionally max instances; traffic and revisions are left alone.

    A no-op when the service is already there. The schedules in prefect.yaml run it to warm the service for
    business hours and let it scale to zero outside them. A `max_instances` whose GPUs exceed the region's quota
    for the service's GPU type is refused, as preflight refuses it in a profile; `gpu_quota` gives the project's
    quota when it was raised above the default (3 L4, 1 RTX Pro 6000). `warm_until` (HH:MM in `timezone`, the
    schedules' scale-up sets it): a scale-up that runs after the warm hours of the day it was due (its worker was
    down) does nothing, so no GPU starts at night.
    """
    if warm_until is not None and min_instances > 0:
        late = late_scale_up(flow_run.get_scheduled_start_time(), datetime.now(UTC), warm_until, timezone)
        if late is not None:
            print(f"{service}: {late}")
            return None
    gcp = load_target(target)
    with service_lock(gcp, service):
        result = run_scale_service(gcp, service, min_instances, max_instances, gpu_quota)
    if result.changed:
        emit("service.scaled", gcp, service, {"min_instances": min_instances, "max_instances": result.max_instances})
    change = "changed" if result.changed else "no change"
    print(f"{service}: min {min_instances}, max {result.max_instances or '-'} ({change})")
    return result
