"""teardown: delete a service, and optionally what it used (lesson 14: idle resources cost money)."""

from __future__ import annotations

from prefect import flow

from flows.common import emit, load_target, service_lock
from tasks.gcp import EnsureResult
from tasks.teardown import (
    compute_delete_network,
    compute_delete_subnet,
    gcs_delete_bucket,
    iam_delete_service_account,
    run_delete_service,
    secretmanager_delete_secret,
)


@flow(name="teardown", log_prints=True)
def teardown(
    service: str,
    target: str = "sandbox",
    network: bool = False,
    service_account: bool = False,
    secret: bool = False,
    staged_weights: bool = False,
) -> list[EnsureResult]:
    """Delete the service, then (when asked) the subnet and network, the service account, the Hub token secret,
    and the bucket with the staged weights, in that order. Each step tolerates what is already gone.
    """
    gcp = load_target(target)
    with service_lock(gcp, service):
        results = [run_delete_service(gcp, service)]
        if network:
            results += [compute_delete_subnet(gcp), compute_delete_network(gcp)]
        if service_account:
            results.append(iam_delete_service_account(gcp))
        if secret:
            results.append(secretmanager_delete_secret(gcp))
        if staged_weights:
            results.append(gcs_delete_bucket(gcp))
    for result in results:
        print(f"{result.kind} {result.name}: {result.action}")
    emit("service.torn_down", gcp, service, {"deleted": [r.name for r in results if r.action == "deleted"]})
    return results
