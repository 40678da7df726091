"""teardown: delete a service, and optionally what it used (lesson 14: idle resources cost money)."""

from __future__ import annotations

from prefect import flow

from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.build_identity import iam_delete_build_service_account
from tasks.gcp import EnsureResult
from tasks.subnet_hold import SubnetHold, prefect_schedule_network_retry
from tasks.teardown import (
    artifactregistry_delete_repository,
    check_service_name,
    compute_delete_network,
    compute_delete_subnet,
    gcs_delete_bucket,
    gcs_delete_build_bucket,
    iam_delete_service_account,
    run_delete_service,
    secretmanager_delete_secret,
)


@flow(name="teardown", log_prints=True)
def teardown(
    service: str,
    target: str = DEFAULT_TARGET,
    network: bool = False,
    service_account: bool = False,
    secret: bool = False,
    staged_weights: bool = False,
    build_bucket: bool = False,
    artifact_repository: bool = False,
) -> list[EnsureResult]:
    """Delete the service, then (when asked) the subnet and network, the service accounts (serving, build), the Hub
    token secret, the bucket with the staged weights, the build bucket with build sources and logs, and the
    Artifact Registry repository with the built images (``artifact_repository``; the service that ran them is gone
    first), in that order. Each step tolerates what is already gone; a ``service`` no Cloud Run service can be
    named is refused before any call.

    Cloud Run keeps a subnet's Direct VPC egress IPs 1-2 h after the last service using it is deleted: the subnet
    and network then come back ``held`` (what holds them, when to retry) and the rest of the teardown goes on. Run
    from a deployment, the flow schedules a network-only run of it for that time; otherwise it prints the command.
    """
    check_service_name(service)  # else a typo reports "absent" while the real service keeps running
    gcp = load_target(target)
    with service_lock(gcp, service):
        results = [run_delete_service(gcp, service)]
        if network:
            subnet = compute_delete_subnet(gcp)
            results.append(subnet)
            if isinstance(subnet, SubnetHold):
                # The network cannot go before its subnet; the same retry deletes both. Nothing else waits on it.
                retry = prefect_schedule_network_retry(service, target, subnet)
                subnet.changes.append(retry)
                results.append(
                    SubnetHold(
                        kind="network", name=f"projects/{gcp.project}/global/networks/{gcp.network}", action="held",
                        changes=[f"its subnet {gcp.subnet} is held; {retry}"], holder=subnet.name,
                        services=subnet.services, retry_at=subnet.retry_at,
                    )
                )  # fmt: skip
            else:
                results.append(compute_delete_network(gcp))
        if service_account:  # the serving account and the build identity
            results += [iam_delete_service_account(gcp), iam_delete_build_service_account(gcp)]
        if secret:
            results.append(secretmanager_delete_secret(gcp))
        if staged_weights:
            results.append(gcs_delete_bucket(gcp))
        if build_bucket:
            results.append(gcs_delete_build_bucket(gcp))
        if artifact_repository:
            results.append(artifactregistry_delete_repository(gcp))
    for result in results:
        print(f"{result.kind} {result.name}: {result.action}" + "".join(f"; {c}" for c in result.changes))
    emit("service.torn_down", gcp, service, {"deleted": [r.name for r in results if r.action == "deleted"]})
    return results
