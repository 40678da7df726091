"""teardown: delete a service, and optionally what it used (lesson 14: idle resources cost money)."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from blocks.target import GcpTarget
from flows.common import DEFAULT_TARGET, emit, load_target, service_lock
from tasks.common.gcp import EnsureResult
from tasks.common.progress import artifact_key
from tasks.infra.build_identity import iam_delete_build_service_account
from tasks.infra.shared_use import TargetUsage, run_read_usage
from tasks.infra.subnet_hold import SubnetHold, prefect_schedule_network_retry
from tasks.infra.teardown import (
    artifactregistry_delete_repository,
    check_service_name,
    compute_delete_network,
    compute_delete_subnet,
    gcs_delete_build_bucket,
    gcs_delete_reports,
    gcs_delete_staged_weights,
    iam_delete_service_account,
    kept,
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
    reports: bool = False,
) -> list[EnsureResult]:
    """Delete the service, then (when asked) the subnet and network, the service accounts (serving, build), the Hub
    token secret, the service's run reports, the bucket with the staged weights, the build bucket with build sources
    and logs, and the Artifact Registry repository with the built images (``artifact_repository``; the service that
    ran them is gone first), in that order. Each step tolerates what is already gone; a ``service`` no Cloud Run
    service can be named is refused before any call.

    Cloud Run keeps a subnet's Direct VPC egress IPs 1-2 h after the last service using it is deleted: the subnet
    and network then come back ``held`` (what holds them, when to retry) and the rest of the teardown goes on. Run
    from a deployment, the flow schedules a network-only run of it for that time; otherwise it prints the command.

    Args:
        service: The Cloud Run service to delete, e.g. gemma-4-e2b.
        target: The GcpTarget block that names the project and region (bootstrap saves `production`).
        network: Also delete the target's subnet and VPC network (Direct VPC egress); kept while another service's
            egress goes through them.
        service_account: Also delete the serving service account (kept while another service runs as it) and the
            Cloud Build identity.
        secret: Also delete the Secret Manager secret holding the Hub token; kept while another service reads it.
        staged_weights: Also delete the weights this service's revisions read from the bucket, then the bucket once
            nothing is left in it; weights another service reads stay, and so do run reports (see ``reports``).
        build_bucket: Also delete the Cloud Build bucket with build sources and logs (images stay in the registry).
        artifact_repository: Also delete the Artifact Registry repository with the built images; kept while another
            service runs one of them.
        reports: Also delete this service's run reports in the bucket (reports/<service>/, tasks/report/archive.py).
            Kept by default: they are the service's history once Prefect's retention (7 days on Hobby and Starter)
            has dropped its runs. Another service's reports are never touched.
    """
    check_service_name(service)  # else a typo reports "absent" while the real service keeps running
    gcp = load_target(target)
    with service_lock(gcp, service):
        usage = run_read_usage(gcp, service)  # before the service goes: its revisions name what it used
        results = [run_delete_service(gcp, service)]
        if network:
            results += _network(gcp, usage, service, target)
        if service_account:  # the serving account (shared by every service on the target) and the build identity
            users = usage.users("accounts", gcp.service_account_email)
            results.append(kept("service-account", gcp.service_account_email, users, "their identity") if users
                           else iam_delete_service_account(gcp))  # fmt: skip
            results.append(iam_delete_build_service_account(gcp))
        if secret:
            users = usage.users("secrets", gcp.hf_token_secret)
            results.append(kept("secret", gcp.hf_token_secret, users, "a secret of theirs") if users
                           else secretmanager_delete_secret(gcp))  # fmt: skip
        if reports:  # before the weights: the bucket goes only when nothing is left in it
            results.append(gcs_delete_reports(gcp, service))
        if staged_weights:
            results.append(gcs_delete_staged_weights(gcp, usage))
        if build_bucket:
            results.append(gcs_delete_build_bucket(gcp))
        if artifact_repository:
            users = usage.image_users(gcp)
            results.append(kept("artifact-registry", gcp.artifact_repository, users, "their images") if users
                           else artifactregistry_delete_repository(gcp))  # fmt: skip
    lines = [f"{r.kind} {r.name}: {r.action}" + "".join(f"; {c}" for c in r.changes) for r in results]
    for line in lines:
        print(line)
    _publish(service, results)
    emit("service.torn_down", gcp, service, {"deleted": [r.name for r in results if r.action == "deleted"]})
    return results


def _network(gcp: GcpTarget, usage: TargetUsage, service: str, target: str) -> list[EnsureResult]:
    """The subnet, then the network; both kept while another service's egress uses them, and ``held`` (with a retry
    scheduled) while Cloud Run still holds the subnet's IPs after its last service went."""
    network_name = f"projects/{gcp.project}/global/networks/{gcp.network}"
    users = sorted({*usage.users("subnets", gcp.subnet), *usage.users("networks", gcp.network)})
    if users:
        subnet_name = f"projects/{gcp.project}/regions/{gcp.region}/subnetworks/{gcp.subnet}"
        return [kept("subnet", subnet_name, users, "Direct VPC egress through it"),
                kept("network", network_name, users, "Direct VPC egress through it")]  # fmt: skip
    subnet = compute_delete_subnet(gcp)
    if not isinstance(subnet, SubnetHold):
        return [subnet, compute_delete_network(gcp)]
    # The network cannot go before its subnet; the same retry deletes both. Nothing else waits on it.
    retry = prefect_schedule_network_retry(service, target, subnet)
    subnet.changes.append(retry)
    network = SubnetHold(
        kind="network", name=network_name, action="held", changes=[f"its subnet {gcp.subnet} is held; {retry}"],
        holder=subnet.name, services=subnet.services, retry_at=subnet.retry_at,
    )  # fmt: skip
    return [subnet, network]


def _publish(service: str, results: list[EnsureResult]) -> None:
    """What the teardown did, one row per resource, as the run's artifact; the last log line says it in short."""
    rows = "\n".join(
        f"| {r.kind} | `{r.name}` | {r.action} | {'; '.join(r.changes)} |".replace("\n", " ") for r in results
    )
    done = {a: sum(r.action == a for r in results) for a in ("deleted", "kept", "held", "absent")}
    summary = ", ".join(f"{n} {a}" for a, n in done.items() if n)
    markdown = (
        f"# Teardown of {service}\n\n{summary}\n\n| resource | name | action | details |\n|---|---|---|---|\n{rows}\n"
    )
    create_markdown_artifact(markdown, key=artifact_key(f"teardown-{service}"), description=f"teardown of {service}")
    print(
        f"teardown {service}: {summary}" + ("; shared resources other services use were kept" if done["kept"] else "")
    )
