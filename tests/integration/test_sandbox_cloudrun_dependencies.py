"""Cloud Run's checks on what a revision depends on elsewhere: image, service account, VPC, secrets."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.cloud import run_v2
from pydantic import SecretStr

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.infra import access, ensure
from tests.support.models import let_read
from tests.support.services import gpu_service, vllm_args

BUCKET = "cloudrun-deps-weights"
_ids = itertools.count()
# The weights bucket and the secret are granted with raw calls right before the deploys, which have no product wait.
pytestmark = pytest.mark.usefixtures("grants_propagated")


@pytest.fixture
def target(sb, services, sandbox_target) -> Iterator[GcpTarget]:
    """Names of the test's own; what earlier tests left idle is gone first (Cloud Run's idle time has passed), and the
    services the test deployed are deleted after it."""
    sb.run("POST", "/idle")
    n = next(_ids)
    yield sandbox_target.model_copy(
        update={
            "service_account_name": f"deps-sa-{n}",
            "network": f"deps-vpc-{n}",
            "subnet": f"deps-vpc-{n}-subnet",
            "hf_token_secret": f"deps-secret-{n}",
        }
    )
    for service in services.list_services(parent=sandbox_target.location_path):
        if service.name.rsplit("/", 1)[1].startswith("deps-"):  # this module's (deploy below)
            services.delete_service(name=service.name).result(polling=clients.operation_polling(sandbox_target))


def deploy(services, target, spec: run_v2.Service) -> run_v2.Service:
    return services.create_service(parent=target.location_path, service=spec, service_id=f"deps-{next(_ids)}").result(
        timeout=60, polling=clients.operation_polling(target)
    )


def test_a_missing_service_account_is_refused_and_none_means_the_compute_default(services, target):
    spec = gpu_service(BUCKET)
    spec.template.service_account = target.service_account_email
    # Cloud Run's actAs check cannot tell a missing account from one the caller may not use.
    denied = f"Permission 'iam.serviceaccounts.actAs' denied on service account {target.service_account_email} "
    with pytest.raises(exceptions.Forbidden, match=re.escape(f"{denied}(or it may not exist).")):
        deploy(services, target, spec)
    default = deploy(services, target, gpu_service(BUCKET))
    revision = clients.run_revisions(target).get_revision(name=default.latest_ready_revision)
    assert revision.service_account == "123456789012-compute@developer.gserviceaccount.com"


def test_project_images_must_be_in_artifact_registry(sb, services, target):
    image = f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}/vllm-openai:v1"
    spec = gpu_service(BUCKET, image=image, args=vllm_args()[2:])  # built images prepend `vllm serve` themselves
    with pytest.raises(exceptions.BadRequest, match=f"Image '{image}' not found"):
        deploy(services, target, spec)
    ensure.ensure_artifact_registry(target)
    sb.admin.post(
        "/artifactregistry/images",
        json={
            "repository": target.artifact_repository,
            "image": "vllm-openai",
            "tags": ["v1"],
            "location": target.region,
        },
    ).raise_for_status()
    assert deploy(services, target, spec).latest_ready_revision


def test_direct_vpc_egress_needs_the_network_and_subnet(services, target):
    spec = gpu_service(BUCKET)
    spec.template.vpc_access = run_v2.VpcAccess(
        network_interfaces=[run_v2.VpcAccess.NetworkInterface(network=target.network, subnetwork=target.subnet)],
        egress=run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC,
    )
    with pytest.raises(exceptions.BadRequest, match=f"VPC network '{target.network}' not found"):
        deploy(services, target, spec)
    ensure.ensure_network(target)
    ensure.ensure_subnet(target)
    assert deploy(services, target, spec).latest_ready_revision


@pytest.mark.usefixtures("iam_propagated")  # deploys as an account created a moment ago, raw
def test_secret_env_needs_the_accessor_role_on_that_secret(services, target):
    ensure.ensure_service_account(target)
    let_read(clients.storage(target), BUCKET, [f"serviceAccount:{target.service_account_email}"])
    ensure.ensure_secret(target, SecretStr("hf_secretForTheContainer000000000000"))
    spec = gpu_service(BUCKET)
    spec.template.service_account = target.service_account_email
    spec.template.containers[0].env.append(
        run_v2.EnvVar(
            name="HF_TOKEN",
            value_source=run_v2.EnvVarSource(
                secret_key_ref=run_v2.SecretKeySelector(secret=target.hf_token_secret, version="latest")
            ),
        )
    )
    denied = r"Permission denied on secret: .*roles/secretmanager\.secretAccessor"
    with pytest.raises(exceptions.GoogleAPICallError, match=denied):
        deploy(services, target, spec)
    access.grant_secret_accessor(target)
    assert deploy(services, target, spec).latest_ready_revision
