"""vLLM's liveness probe (issue 35): a container whose engine died is restarted, in all three forms the product renders
(the run.v2 service, its Knative YAML, the gcloud command), each checked against Google's own contract."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from google.cloud import run_v2

from blocks import GcpTarget, ModelSource, ServingProfile
from sandbox.conformance.schema import walker
from tasks.deploy.render import Weights, gcloud_command, render_service, service_yaml

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)
PRESETS = ("l4", "rtx-pro-6000", "cpu")


def render(preset: str, **overrides) -> run_v2.Service:
    profile = ServingProfile.preset(preset, **overrides)
    image = profile.image or "us-docker.pkg.dev/p/r/vllm-cpu:1"
    return render_service(profile, TARGET, SOURCE, WEIGHTS, image, revision="gemma-rev")


def vllm_container(service: run_v2.Service) -> run_v2.Container:
    return next(c for c in service.template.containers if c.ports)


@pytest.mark.parametrize("preset", PRESETS)
def test_vllms_health_is_probed_for_liveness_and_a_dead_engine_is_restarted_within_a_minute(preset):
    container = vllm_container(render(preset))
    probe = container.liveness_probe
    assert (probe.http_get.path, probe.http_get.port) == ("/health", container.ports[0].container_port)
    # Cloud Run's limits (run.v2 Probe): period 1-3600 s, a timeout shorter than the period, a threshold of 1 or more.
    assert 1 <= probe.timeout_seconds < probe.period_seconds <= 3600 and probe.failure_threshold >= 1
    # /health answers in milliseconds (it reads a flag): a timeout of seconds, and several misses in a row.
    assert probe.timeout_seconds >= 5 and probe.failure_threshold >= 3
    assert probe.period_seconds * probe.failure_threshold <= 60  # a dead engine serves errors at most a minute
    # The startup probe still decides when the container has started; liveness begins after it.
    assert container.startup_probe.http_get.path == "/health"


@pytest.mark.parametrize("metrics", ["none", "vllm"])
def test_the_service_with_its_liveness_probe_conforms_to_run_v2(metrics):
    body = json.loads(run_v2.Service.to_json(render("l4", metrics=metrics)))
    assert walker("run.v2", "request").check("GoogleCloudRunV2Service", body) == []
    probe = next(c for c in body["template"]["containers"] if c.get("ports"))["livenessProbe"]
    assert (probe["httpGet"]["path"], probe["httpGet"]["port"]) == ("/health", 8080)
    assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (10, 5, 3)


def test_the_yaml_carries_the_liveness_probe_on_the_vllm_container():
    document = yaml.safe_load(service_yaml("gemma", TARGET, render("l4")))
    assert walker("run.v1", "request").check("Service", document) == []
    (vllm,) = document["spec"]["template"]["spec"]["containers"]
    assert vllm["livenessProbe"] == {
        "httpGet": {"path": "/health", "port": 8080},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }


def test_the_gcloud_command_gives_the_vllm_container_its_liveness_probe():
    words = shlex.split(gcloud_command("gemma", TARGET, render("l4", metrics="vllm")).replace("\\\n", " "))
    vllm = words[words.index("--container=vllm") : words.index("--container=collector")]
    assert (
        "--liveness-probe=httpGet.path=/health,httpGet.port=8080,periodSeconds=10,timeoutSeconds=5,failureThreshold=3"
        in vllm
    )
