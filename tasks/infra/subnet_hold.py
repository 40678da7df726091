"""A subnet that Cloud Run's Direct VPC egress still holds: what holds it, when to retry, and the retry itself.

Cloud Run reserves IPs in the subnet for every service that uses it through Direct VPC egress and keeps them
for 1-2 hours after the last such service is deleted (Cloud Run docs, "Direct VPC egress with a VPC network":
"After you delete or move your Cloud Run resources, wait 1-2 hours for Cloud Run to release the IPs before you
delete the subnet"). Until then Compute refuses ``subnetworks.delete`` with 400 ``resourceInUseByAnotherResource``,
naming a ``serverless-ipv4-...`` address (nitrictech/nitric issue 667). A teardown that asked for the network
cannot finish then: it says why and when to retry, and schedules the retry itself when it runs from a deployment.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime, timedelta
from uuid import UUID

from google.api_core import exceptions as gexc
from prefect import task
from prefect.deployments import run_deployment
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from pydantic import Field

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, EnsureResult

# The upper end of Cloud Run's documented 1-2 hours: a retry at that time finds the IPs released.
RELEASE_WAIT = timedelta(hours=2)
IN_USE = "resourceInUseByAnotherResource"
# The deployment prefect.yaml declares for the teardown flow (`prefect deployment run teardown/teardown`).
TEARDOWN_DEPLOYMENT = "teardown/teardown"
_HOLDER = re.compile(r"is already being used by '([^']+)'")


class SubnetHold(EnsureResult):
    """A subnet (or its network) that cannot be deleted yet, with what holds it and when to try again."""

    holder: str = Field("", description="What Compute says uses the subnet (a serverless-ipv4 address).")
    services: list[str] = Field(default_factory=list, description="Cloud Run services that still use the subnet.")
    retry_at: datetime | None = Field(None, description="When a retry should find it free; None: delete users first.")


def holder_of(exc: gexc.GoogleAPICallError) -> str | None:
    """The resource Compute names when it refuses a delete because something uses the subnet, else None."""
    reasons = {e.get("reason") for e in (exc.errors or []) if isinstance(e, dict)}
    if IN_USE not in reasons and IN_USE not in str(exc):
        return None
    found = _HOLDER.search(str(exc))
    return found.group(1) if found else "another resource"


def services_using_subnet(target: GcpTarget) -> list[str]:
    """Cloud Run services in the target's region whose Direct VPC egress (current template) uses its subnet."""
    users = []
    for service in clients.run_services(target).list_services(parent=target.location_path, retry=GCP_RETRY):
        for interface in service.template.vpc_access.network_interfaces:
            # Only a network given: the subnet has the network's name (Cloud Run docs, Direct VPC egress).
            used = (interface.subnetwork or interface.network).rsplit("/", 1)[-1]
            if used == target.subnet:
                users.append(service.name.rsplit("/", 1)[-1])
                break
    return sorted(users)


def subnet_hold(target: GcpTarget, holder: str, now: datetime | None = None) -> SubnetHold:
    """The held subnet as a teardown result: still-used-by services, or the time Cloud Run releases the IPs."""
    name = f"projects/{target.project}/regions/{target.region}/subnetworks/{target.subnet}"
    services = services_using_subnet(target)
    if services:
        why = (
            f"held by {holder}: Cloud Run services {', '.join(services)} still use it through Direct VPC egress; "
            "tear them down first, then retry 1-2 h later (Cloud Run releases the IPs that long after)"
        )
        return SubnetHold(kind="subnet", name=name, action="held", changes=[why], holder=holder, services=services)
    retry_at = (now or datetime.now(UTC)) + RELEASE_WAIT
    why = (
        f"held by {holder}: Cloud Run keeps Direct VPC egress IPs 1-2 h after the last service using the subnet "
        f"is deleted; retry at {retry_at:%Y-%m-%d %H:%M} UTC"
    )
    return SubnetHold(kind="subnet", name=name, action="held", changes=[why], holder=holder, retry_at=retry_at)


def retry_command(service: str, target_name: str, retry_at: datetime) -> str:
    """The command that runs the network-only teardown at ``retry_at`` through the teardown deployment."""
    params = [f"service={service}", f"target={target_name}", "network=true"]
    args = ["prefect", "deployment", "run", TEARDOWN_DEPLOYMENT]
    for param in params:
        args += ["-p", param]
    args += ["--start-at", f"{retry_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"]
    return shlex.join(args)


def schedule_network_retry(service: str, target_name: str, hold: SubnetHold) -> str:
    """Schedule the network-only teardown at the hold's retry time as a run of this run's deployment; outside a
    deployment (a direct call, a test), say which command schedules it. Returns what was done, for the report."""
    if hold.retry_at is None:
        return "no retry scheduled: the services using the subnet must be torn down first"
    deployment_id = current_deployment.id
    if not deployment_id:
        command = retry_command(service, target_name, hold.retry_at)
        return f"not run from a deployment, nothing scheduled; to retry, run: {command}"
    run = run_deployment(
        name=UUID(deployment_id),
        parameters={"service": service, "target": target_name, "network": True},
        scheduled_time=hold.retry_at,
        flow_run_name=f"teardown-network-retry-{service}",
        timeout=0,  # create it and return; it runs at retry_at
        as_subflow=False,  # its own run, hours later, not a child of this one
        tags=["teardown", "network-retry"],
        # One retry per held teardown run, even if this task is retried.
        idempotency_key=f"teardown-network-retry/{current_flow_run.id}",
    )
    return f"scheduled flow run {run.name} ({run.id}) of this deployment at {hold.retry_at:%Y-%m-%d %H:%M} UTC"


prefect_schedule_network_retry = task(name="prefect_schedule_network_retry")(schedule_network_retry)
