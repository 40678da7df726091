"""The Managed Service for Prometheus sidecar beside vLLM (``metrics: vllm``): the run.v2 service, its Knative YAML
and the gcloud command, each checked against Google's own contract (the discovery documents of run.v2 and run.v1)."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from google.cloud import run_v2

from blocks import GcpTarget, ModelSource, ServingProfile
from sandbox.conformance.schema import walker
from tasks.deploy.metrics_sidecar import SIDECAR_IMAGE
from tasks.deploy.render import Weights, gcloud_command, render_service, service_yaml

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)


def render(preset: str, **overrides) -> run_v2.Service:
    profile = ServingProfile.preset(preset, metrics="vllm", **overrides)
    return render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "us-docker.pkg.dev/p/r/vllm-cpu:1",
                          revision="gemma-rev")  # fmt: skip


def quantity(text: str) -> float:
    units = {"Mi": 2**20, "Gi": 2**30}
    return float(text[:-2]) * units[text[-2:]] if text[-2:] in units else float(text)


@pytest.mark.parametrize(
    ("preset", "vllm_size", "collector_size"),
    [
        ("l4", ("6", "24Gi"), ("2", "8Gi")),
        ("cpu", ("2", "8Gi"), ("2", "2Gi")),
    ],  # sizes Cloud Run takes (blocks/hardware)
)
def test_the_sidecar_starts_after_vllm_and_the_instance_keeps_the_presets_totals(preset, vllm_size, collector_size):
    profile = ServingProfile.preset(preset)
    template = render(preset).template
    vllm, collector = template.containers
    assert collector.image == SIDECAR_IMAGE and list(collector.depends_on) == [vllm.name]
    assert vllm.ports and not collector.ports  # one ingress container: the one Cloud Run routes to
    limits = [dict(c.resources.limits) for c in template.containers]
    assert [(x["cpu"], x["memory"]) for x in limits] == [vllm_size, collector_size]
    assert sum(float(x["cpu"]) for x in limits) == profile.cpu
    assert sum(quantity(x["memory"]) for x in limits) == profile.memory_gib * 2**30
    assert dict(vllm.resources.limits).get("nvidia.com/gpu") == ("1" if preset != "cpu" else None)
    assert "nvidia.com/gpu" not in dict(collector.resources.limits)


def test_without_metrics_there_is_one_container_with_the_whole_instance():
    profile = ServingProfile.preset("l4")
    (vllm,) = render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image, revision="gemma-rev").template.containers
    assert dict(vllm.resources.limits) == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}


def test_the_service_conforms_to_run_v2():
    body = json.loads(run_v2.Service.to_json(render("l4")))
    assert walker("run.v2", "request").check("GoogleCloudRunV2Service", body) == []
    assert body["template"]["containers"][1]["dependsOn"] == ["vllm"]


def test_the_yaml_conforms_to_run_v1_with_the_container_dependencies_annotation():
    document = yaml.safe_load(service_yaml("gemma", TARGET, render("l4")))
    assert walker("run.v1", "request").check("Service", document) == []
    template = document["spec"]["template"]
    assert json.loads(template["metadata"]["annotations"]["run.googleapis.com/container-dependencies"]) == {
        "collector": ["vllm"]
    }
    vllm, collector = template["spec"]["containers"]
    assert "ports" in vllm and "ports" not in collector
    assert collector["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": 13133}


def test_the_gcloud_command_reparses_into_service_flags_then_one_group_per_container():
    words = shlex.split(gcloud_command("gemma", TARGET, render("l4")).replace("\\\n", " "))
    first = words.index("--container=vllm")
    assert words.count("--container=collector") == 1 and first < words.index("--container=collector")
    service_flags = words[:first]
    assert "--gpu-type=nvidia-l4" in service_flags and "--no-cpu-throttling" in service_flags
    assert not any(w.startswith(("--image=", "--cpu=", "--port=", "--args=")) for w in service_flags)
    vllm = words[first : words.index("--container=collector")]
    collector = words[words.index("--container=collector") :]
    assert {"--cpu=6", "--memory=24Gi", "--port=8080", "--gpu=1"} <= set(vllm)
    assert {f"--image={SIDECAR_IMAGE}", "--cpu=2", "--memory=8Gi", "--depends-on=vllm"} <= set(collector)
    assert not any(w.startswith(("--port=", "--args=", "--gpu=")) for w in collector)
