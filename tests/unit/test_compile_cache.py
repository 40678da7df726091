"""The compile cache as rendered: a read-write volume on its own folder, vLLM's and Inductor's caches on it, and a
profile that cannot ask for it in a way that would not work."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from blocks import GcpTarget, ModelSource, ServingProfile
from tasks.deploy.render import Weights, gcloud_command, render_service, service_yaml

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)
IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20260101_0000_RC00"


def compiled(preset: str = "l4", **vllm: object) -> ServingProfile:
    return ServingProfile.preset(preset, compile_cache=True, vllm={"enforce_eager": False, **vllm})


def render(profile: ServingProfile):
    return render_service(profile, TARGET, SOURCE, WEIGHTS, IMAGE, revision="svc-rev")


def cache_volume(service):
    (volume,) = [v for v in service.template.volumes if v.name == "compile-cache"]
    return volume


def env(service) -> dict[str, str]:
    return {e.name: e.value for e in service.template.containers[0].env}


def test_the_cache_is_a_read_write_folder_of_the_model_bucket_mounted_at_a_fixed_path():
    service = render(compiled())
    volume = cache_volume(service)
    assert volume.gcs.bucket == TARGET.bucket_name and not volume.gcs.read_only
    (option,) = volume.gcs.mount_options
    assert option.startswith(f"only-dir=compile-cache/{SOURCE.repo_id}/{SHA[:12]}/nvidia-l4-")
    mounts = {m.name: m.mount_path for m in service.template.containers[0].volume_mounts}
    assert mounts == {"model-weights": "/mnt/models", "compile-cache": "/mnt/compile-cache"}
    weights = next(v for v in service.template.volumes if v.name == "model-weights")
    assert weights.gcs.read_only, "the weights stay read-only"


def test_vllm_and_inductor_keep_their_caches_on_the_volume_and_only_vllm_cpu_drops_its_aot_artefact():
    gpu = env(render(compiled()))
    assert gpu["VLLM_CACHE_ROOT"] == "/mnt/compile-cache/vllm"
    assert gpu["TORCHINDUCTOR_CACHE_DIR"] == "/mnt/compile-cache/inductor"
    assert "VLLM_USE_AOT_COMPILE" not in gpu, "vLLM's own AOT artefact loads on GPUs"
    assert env(render(compiled("cpu")))["VLLM_USE_AOT_COMPILE"] == "0"
    plain = env(render(ServingProfile.preset("l4")))
    assert not {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"} & set(plain)
    assert [v.name for v in render(ServingProfile.preset("l4")).template.volumes] == ["model-weights"]


def test_a_change_that_changes_what_is_compiled_gets_its_own_folder_and_the_same_inputs_the_same_one():
    def folder(profile: ServingProfile, image: str = IMAGE, weights: Weights = WEIGHTS) -> str:
        service = render_service(profile, TARGET, SOURCE, weights, image, revision="r")
        return cache_volume(service).gcs.mount_options[0]

    base = folder(compiled())
    assert folder(compiled()) == base
    other_commit = Weights(SOURCE.repo_id, "f" * 40, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{'f' * 40}", 1)
    changed = [
        folder(compiled(max_model_len=4096)),
        folder(compiled(dtype="float16")),
        folder(compiled(), image=IMAGE.replace("RC00", "RC01")),
        folder(compiled(), weights=other_commit),
        folder(compiled("rtx-pro-6000")),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_gcloud_and_the_service_yaml_show_the_cache_volume_read_write():
    service = render(compiled())
    command = gcloud_command("gemma", TARGET, service)
    assert "name=compile-cache,type=cloud-storage" in command and "readonly=false" in command
    assert "name=model-weights,type=cloud-storage" in command and "readonly=true" in command
    volumes = yaml.safe_load(service_yaml("gemma", TARGET, service))["spec"]["template"]["spec"]["volumes"]
    assert {v["name"]: v["csi"]["readOnly"] for v in volumes} == {"model-weights": True, "compile-cache": False}


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"vllm": {"enforce_eager": True}}, "compile_cache", "set vllm.enforce_eager to false"),
        (
            {"vllm": {"enforce_eager": False}, "env": {"VLLM_CACHE_ROOT": "/tmp/x"}},
            "env: VLLM_CACHE_ROOT",
            "remove it from env",
        ),
        (
            {"vllm": {"enforce_eager": False}, "mount_path": "/mnt/compile-cache/models"},
            "mount_path",
            "/mnt/models",
        ),
    ],
)
def test_a_compile_cache_that_could_not_work_is_refused_naming_the_field_and_the_fix(overrides, field, fix):
    with pytest.raises(ValidationError) as raised:
        ServingProfile.preset("l4", compile_cache=True, **overrides)
    assert field in str(raised.value) and fix in str(raised.value)
