"""Preview GPUs need a launch stage: Cloud Run refuses the RTX Pro 6000 on a GA service; the product declares BETA.

The refusal is Cloud Run's (400, FAILED_PRECONDITION, "The feature ... is not supported in the declared launch
stage ..."); the product's rendered service for the rtx-pro-6000 profile is admitted, and the same service without
the product's launch stage is refused, so the test fails if the product stops setting it.
"""

from __future__ import annotations

import itertools

import pytest
from google.api import launch_stage_pb2
from google.api_core import exceptions
from google.cloud import run_v2

from blocks import ModelSource, ServingProfile
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.deploy.render import Weights, render_service
from tasks.infra import ensure
from tasks.infra.propagation import when_visible
from tests.support.services import gpu_service

LAUNCH_STAGE_MESSAGE = (
    "The feature 'GPU type nvidia-rtx-pro-6000' is not supported in the declared launch stage on resource {id}. "
    "The launch stage annotation should be specified at least as BETA."
)
RTX = {"gpu": "nvidia-rtx-pro-6000", "cpu": "20", "memory": "80Gi"}
_ids = itertools.count()


@pytest.fixture(scope="module")
def services(sandbox_target) -> run_v2.ServicesClient:
    return clients.run_services(sandbox_target)


def validate(services, target: GcpTarget, service: run_v2.Service, service_id: str) -> run_v2.Service:
    """Create with validateOnly: admission runs in full, nothing starts."""
    request = run_v2.CreateServiceRequest(
        parent=target.location_path, service=service, service_id=service_id, validate_only=True
    )
    return services.create_service(request=request).result(polling=clients.operation_polling(target))


def test_a_preview_gpu_without_launch_stage_beta_is_refused_as_cloud_run_does(services, sandbox_target):
    service_id = f"launch-{next(_ids)}"
    with pytest.raises(exceptions.BadRequest) as caught:
        validate(services, sandbox_target, gpu_service("w", **RTX), service_id)
    assert LAUNCH_STAGE_MESSAGE.format(id=service_id) in caught.value.message
    assert "https://cloud.google.com/run/docs/troubleshooting#launch-stage-validation" in caught.value.message
    error = caught.value.response.json()["error"]
    assert (error["code"], error["status"]) == (400, "FAILED_PRECONDITION")
    with pytest.raises(exceptions.BadRequest):  # GA, said explicitly, is no better than unset
        validate(services, sandbox_target, gpu_service("w", **RTX, launch_stage="GA"), service_id)


@pytest.mark.parametrize("stage", ["BETA", "ALPHA"])
@pytest.mark.usefixtures("raised_quota")  # an RTX Pro 6000 instance is 80 GiB: no new project holds one
def test_a_preview_gpu_is_admitted_at_beta_or_a_less_stable_stage(services, sandbox_target, stage):
    admitted = validate(services, sandbox_target, gpu_service("w", **RTX, launch_stage=stage), f"launch-{next(_ids)}")
    assert admitted.template.node_selector.accelerator == "nvidia-rtx-pro-6000"


def test_the_l4_is_ga_and_needs_no_launch_stage(services, sandbox_target):
    admitted = validate(services, sandbox_target, gpu_service("w"), f"launch-{next(_ids)}")
    assert admitted.template.node_selector.accelerator == "nvidia-l4"


@pytest.fixture(scope="module")
def infra_target(sandbox_target) -> GcpTarget:
    """A target whose network, subnet and service account exist, so the product's full render can be admitted."""
    target = sandbox_target.model_copy(
        update={"network": "launch-vpc", "subnet": "launch-vpc-subnet", "service_account_name": "launch-serving"}
    )
    ensure.ensure_network(target)
    ensure.ensure_subnet(target)
    ensure.ensure_service_account(target)
    return target


def rendered_rtx_service(target: GcpTarget) -> run_v2.Service:
    profile = ServingProfile.preset("rtx-pro-6000")
    source = ModelSource(repo_id="sandbox/tiny-chat")
    commit = "0123456789abcdef0123456789abcdef01234567"
    weights = Weights(source.repo_id, commit, target.bucket_name, f"model-cache/{source.repo_id}/{commit}", 10**9)
    return render_service(profile, target, source, weights, profile.image or "", revision="")


@pytest.mark.usefixtures("raised_quota")  # an RTX Pro 6000 instance is 80 GiB: no new project holds one
def test_the_products_rtx_pro_6000_service_is_admitted_and_would_not_be_without_its_launch_stage(
    services, infra_target
):
    service = rendered_rtx_service(infra_target)
    service_id = f"launch-{next(_ids)}"
    # The account was just created: wait as the product does until Cloud Run can see it (tasks/infra/propagation.py).
    email = infra_target.service_account_email
    admitted = when_visible(lambda: validate(services, infra_target, service, service_id), email, "Cloud Run")
    assert admitted.template.node_selector.accelerator == "nvidia-rtx-pro-6000"
    assert admitted.launch_stage == launch_stage_pb2.LaunchStage.BETA

    without = run_v2.Service(service)
    without.launch_stage = "LAUNCH_STAGE_UNSPECIFIED"
    with pytest.raises(exceptions.BadRequest) as caught:
        validate(services, infra_target, without, service_id)
    assert LAUNCH_STAGE_MESSAGE.format(id=service_id) in caught.value.message
