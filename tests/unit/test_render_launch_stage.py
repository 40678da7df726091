"""The launch stage comes from the GPU catalogue: a preview GPU renders BETA, and the human forms say so too."""

from __future__ import annotations

import shlex

import pytest
import yaml
from google.api import launch_stage_pb2

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.hardware import GPUS
from tasks.deploy.render import Weights, gcloud_command, render_service, service_yaml

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)


def render(preset: str):
    profile = ServingProfile.preset(preset)
    return render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "us-docker.pkg.dev/p/r/vllm:1", "svc-r")


def test_the_catalogue_knows_which_gpus_are_preview():
    assert GPUS["nvidia-l4"].launch_stage == "GA"
    assert GPUS["nvidia-rtx-pro-6000"].launch_stage == "BETA"


def test_the_rtx_pro_6000_service_declares_beta_like_seed_004s_gcloud_beta_deploy():
    service = render("rtx-pro-6000")
    assert service.launch_stage == launch_stage_pb2.LaunchStage.BETA
    words = shlex.split(gcloud_command("gemma", TARGET, service).replace("\\\n", " "))
    assert words[:5] == ["gcloud", "beta", "run", "deploy", "gemma"]
    assert "--gpu-type=nvidia-rtx-pro-6000" in words
    document = yaml.safe_load(service_yaml("gemma", TARGET, service))
    assert document["metadata"]["annotations"]["run.googleapis.com/launch-stage"] == "BETA"


@pytest.mark.parametrize("preset", ["l4", "cpu"])
def test_ga_hardware_stays_on_the_ga_track(preset):
    service = render(preset)
    assert service.launch_stage == launch_stage_pb2.LaunchStage.GA
    words = shlex.split(gcloud_command("gemma", TARGET, service).replace("\\\n", " "))
    assert words[:4] == ["gcloud", "run", "deploy", "gemma"]
    assert (
        "run.googleapis.com/launch-stage"
        not in yaml.safe_load(service_yaml("gemma", TARGET, service))["metadata"]["annotations"]
    )
