"""Egress and runtime Hub access agree: ALL_TRAFFIC offline by default, PRIVATE_RANGES_ONLY for runtime Hub access."""

from __future__ import annotations

import yaml
from google.cloud import run_v2

from blocks import GcpTarget, ModelSource, ServingProfile
from tasks.checks.preflight import check_service
from tasks.deploy.render import Weights, gcloud_command, render_service, service_yaml

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)
ALL_TRAFFIC = run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC
PRIVATE_RANGES_ONLY = run_v2.VpcAccess.VpcEgress.PRIVATE_RANGES_ONLY
RUNTIME_HUB = {"hf_token_at_runtime": True, "vllm": {"extra_args": ["--tokenizer", "google/gemma-4-E2B-it"]}}


def render(profile: ServingProfile) -> run_v2.Service:
    return render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "", revision="svc-rev")


def env_of(service: run_v2.Service) -> dict[str, str]:
    return {e.name: e.value for e in service.template.containers[0].env}


def runtime_hub_errors(profile: ServingProfile, service: run_v2.Service) -> list[str]:
    return [f.message for f in check_service(profile, service) if f.setting == "hf_token_at_runtime"]


def test_a_service_that_never_leaves_google_sends_all_traffic_into_the_vpc_offline():
    profile = ServingProfile.preset("l4")
    service = render(profile)
    assert service.template.vpc_access.egress == ALL_TRAFFIC
    assert env_of(service)["HF_HUB_OFFLINE"] == "1"
    assert "--vpc-egress=all-traffic" in gcloud_command("svc", TARGET, service)
    annotations = yaml.safe_load(service_yaml("svc", TARGET, service))["spec"]["template"]["metadata"]["annotations"]
    assert annotations["run.googleapis.com/vpc-access-egress"] == "all-traffic"
    assert runtime_hub_errors(profile, service) == []


def test_runtime_hub_access_renders_private_ranges_only_egress_and_no_offline_mode():
    profile = ServingProfile.preset("l4", **RUNTIME_HUB)
    service = render(profile)
    assert service.template.vpc_access.egress == PRIVATE_RANGES_ONLY  # the Hub over Cloud Run's own path
    assert service.template.vpc_access.network_interfaces[0].subnetwork == TARGET.subnet  # private ranges still
    env = env_of(service)
    assert "HF_HUB_OFFLINE" not in env and "HF_TOKEN" in env
    assert "--vpc-egress=private-ranges-only" in gcloud_command("svc", TARGET, service)
    annotations = yaml.safe_load(service_yaml("svc", TARGET, service))["spec"]["template"]["metadata"]["annotations"]
    assert annotations["run.googleapis.com/vpc-access-egress"] == "private-ranges-only"
    findings = check_service(profile, service)
    assert not [f for f in findings if f.severity == "error"]
    assert not [f for f in findings if "HF_HUB_OFFLINE" in f.message]  # offline would contradict the profile


def test_preflight_refuses_runtime_hub_access_through_all_traffic_egress():
    """What the renderer used to send: HF_TOKEN for the Hub, and every packet into a VPC without Cloud NAT."""
    profile = ServingProfile.preset("l4", **RUNTIME_HUB)
    service = render(profile)
    service.template.vpc_access.egress = ALL_TRAFFIC
    [message] = runtime_hub_errors(profile, service)
    assert "ALL_TRAFFIC" in message and "Cloud NAT" in message and "PRIVATE_RANGES_ONLY" in message


def test_preflight_refuses_runtime_hub_access_in_offline_mode():
    profile = ServingProfile.preset("l4", **RUNTIME_HUB, env={"HF_HUB_OFFLINE": "1"})
    [message] = runtime_hub_errors(profile, render(profile))
    assert "HF_HUB_OFFLINE=1" in message and "remove HF_HUB_OFFLINE" in message
