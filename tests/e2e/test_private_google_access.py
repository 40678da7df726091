"""Private Google Access: with all-traffic Direct VPC egress (the default render), Cloud Storage is reached through
the VPC, so the subnet needs Private Google Access (Cloud Run's networking best practices). A reused subnet without
it fails the revision, which cannot read its weights volume; promote-model turns it on again (ensure infrastructure)
and doctor names it."""

from __future__ import annotations

import itertools

import pytest
from google.cloud import compute_v1

from tasks.checks import doctor as checks
from tasks.common import clients
from tasks.deploy.cloudrun import DeployFailed, deploy_candidate
from tests.support.promotion import promote, run_service

pytestmark = pytest.mark.prefect
_ids = itertools.count()


def set_private_google_access(target, enabled: bool) -> None:
    clients.compute_subnetworks(target).set_private_ip_google_access_unary(
        project=target.project, region=target.region, subnetwork=target.subnet,
        subnetworks_set_private_ip_google_access_request_resource=compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(
            private_ip_google_access=enabled
        ),
    )  # fmt: skip


@pytest.mark.usefixtures("raised_quota")  # a candidate beside the serving revision, twice (zero-downtime)
def test_without_private_google_access_the_weights_cannot_load_and_promote_model_turns_it_back_on(sb, flow_env):
    service = f"pga-{next(_ids)}"
    old = promote(service).serving_revision
    set_private_google_access(flow_env, False)
    try:
        row = checks.check_subnet(flow_env)
        assert row.status == "warn" and "Private Google Access is off" in row.detail
        assert f"gcloud compute networks subnets update {flow_env.subnet}" in row.fix
        # A deploy on the subnet as found: the revision's Cloud Storage volume reads nothing, it never gets ready.
        spec = run_service(flow_env, service)
        spec.template.revision = f"{service}-no-pga"
        spec.template.containers[0].env.append({"name": "CHANGED", "value": "1"})
        with pytest.raises(DeployFailed, match=r"is not ready and cannot serve traffic"):
            deploy_candidate(flow_env, service, spec)
        # promote-model's ensure step repairs the subnet first: the same promotion goes through.
        report = promote(service, revision="dev")
    finally:
        set_private_google_access(flow_env, True)
    assert report.outcome == "promoted" and report.serving_revision != old
    subnet = clients.compute_subnetworks(flow_env).get(
        project=flow_env.project, region=flow_env.region, subnetwork=flow_env.subnet
    )
    assert subnet.private_ip_google_access
    assert checks.check_subnet(flow_env).status == "ok"
