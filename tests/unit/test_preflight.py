"""Preflight: each field lesson that can be checked statically is a finding naming the setting and the fix."""

from __future__ import annotations

import pytest

from blocks import GcpTarget, ModelSource, ServingProfile
from tasks.checks.findings import PreflightError
from tasks.checks.preflight import ModelFacts, check_model, check_profile, check_service, raise_on_errors
from tasks.deploy.render import Weights, render_service

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="org/model")
WEIGHTS = Weights("org/model", "a" * 40, TARGET.bucket_name, f"model-cache/org/model/{'a' * 40}", 5 * 10**9)
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}


def errors_and_warnings(findings) -> tuple[list[str], list[str]]:
    return (
        [f.setting for f in findings if f.severity == "error"],
        [f.setting for f in findings if f.severity == "warning"],
    )


def service_of(profile: ServingProfile, **container_changes):
    service = render_service(profile, TARGET, SOURCE, WEIGHTS, profile.image or "img:1", revision="r")
    for key, value in container_changes.items():
        setattr(service.template.containers[0], key, value)
    return service


def test_the_presets_pass_preflight():
    for name in ("l4", "rtx-pro-6000"):
        profile = ServingProfile.preset(name)
        assert (
            raise_on_errors(check_profile(profile, TARGET, "svc") + check_service(profile, service_of(profile))) == []
        )


@pytest.mark.parametrize(
    ("profile", "setting", "lesson", "text"),
    [
        (
            ServingProfile.preset("l4", image="vllm/vllm-openai:v0.33.0"),
            "image",
            1,
            "NVIDIA driver on your system is too old",
        ),
        (
            ServingProfile.preset("l4", image="vllm/vllm-openai:latest", allow_generic_vllm_image=True),
            "image",
            1,
            "not pinned",
        ),
        (
            ServingProfile.preset("rtx-pro-6000", gpu_zonal_redundancy=True),
            "gpu_zonal_redundancy",
            13,
            "--no-gpu-zonal-redundancy",
        ),
        (ServingProfile.preset("cpu", env={}), "env", 9, "VLLM_ENABLE_V1_MULTIPROCESSING=0"),
    ],
)
def test_profile_errors(profile, setting, lesson, text):
    findings = [f for f in check_profile(profile, TARGET, "svc") if f.severity == "error"]
    assert [(f.setting, f.lesson) for f in findings] == [(setting, lesson)]
    assert text in findings[0].message


def test_a_region_without_the_gpu_type_is_an_error():
    findings = check_profile(
        ServingProfile.preset("rtx-pro-6000"), TARGET.model_copy(update={"region": "europe-west1"}), "s"
    )
    assert errors_and_warnings(findings)[0] == ["gpu_type"]
    assert "not offered in europe-west1" in findings[0].message


def test_concurrency_below_max_num_seqs_is_an_error():
    findings = check_profile(ServingProfile.preset("l4", concurrency=8), TARGET, "svc")
    assert errors_and_warnings(findings) == (["concurrency"], [])


def test_max_num_seqs_above_cloud_runs_concurrency_limit_is_an_error():
    profile = ServingProfile.preset("l4", vllm={"max_num_seqs": 2048})
    findings = check_profile(profile, TARGET, "svc")
    assert errors_and_warnings(findings) == (["vllm.max_num_seqs"], [])
    assert "lower max_num_seqs to 1000" in findings[0].message


def test_a_service_name_too_long_for_its_tag_url_is_an_error():
    assert errors_and_warnings(check_profile(ServingProfile.preset("l4"), TARGET, "x" * 40))[0] == ["service"]


@pytest.mark.parametrize(
    ("changes", "setting", "lesson"),
    [
        ({"args": ["serve", "/mnt/models/m", "--port", "8080"]}, "args", 2),
        ({"args": ["vllm", "serve", "--model=/mnt/models/m", "--port", "8080"]}, "args", 5),
        ({"args": ["vllm", "serve", "/mnt/models/m", "--port", "8000"]}, "container_port", 4),
        ({"args": ["vllm", "serve", "google/gemma", "--port", "8080"]}, "args", 11),
    ],
)
def test_rendered_service_errors(changes, setting, lesson):
    profile = ServingProfile.preset("l4")
    findings = [f for f in check_service(profile, service_of(profile, **changes)) if f.severity == "error"]
    assert (findings[0].setting, findings[0].lesson) == (setting, lesson)


def test_eager_off_needs_a_probe_window_of_six_minutes():
    profile = ServingProfile.preset("l4", vllm={"enforce_eager": False})
    service = service_of(profile)
    service.template.containers[0].startup_probe.failure_threshold = 120  # 4 minutes
    findings = check_service(profile, service)
    assert [(f.setting, f.lesson) for f in findings if f.severity == "error"] == [("vllm.enforce_eager", 3)]
    assert check_service(profile, service_of(profile)) == []  # the renderer sizes the window for the compile


def test_a_mount_under_dev_is_an_error():
    profile = ServingProfile.preset("l4")
    service = service_of(profile)
    service.template.containers[0].volume_mounts[0].mount_path = "/dev/shm"
    assert ("mount_path", 9) in [(f.setting, f.lesson) for f in check_service(profile, service)]


def test_weights_larger_than_the_gpu_are_an_error():
    findings = check_model(ServingProfile.preset("l4"), ModelFacts(weights_bytes=30 * 10**9))
    assert errors_and_warnings(findings)[0] == ["gpu_type"]
    assert "offers 21.6 GB" in findings[0].message
    fp32 = check_model(ServingProfile.preset("l4", vllm={"dtype": "float32"}), ModelFacts(weights_bytes=12 * 10**9))
    assert errors_and_warnings(fp32)[0] == ["gpu_type"]  # a 16-bit checkpoint doubles in fp32


@pytest.mark.parametrize(
    ("vllm", "config", "fits"),
    [
        ({}, {"torch_dtype": "bfloat16"}, False),  # 30 GB of bf16 on a 21.6 GB budget
        ({"quantization": "fp8"}, {"torch_dtype": "bfloat16"}, True),  # quantized while loading: 15 GB
        ({}, {"torch_dtype": "float32"}, True),  # an fp32 checkpoint served in 16 bits: 15 GB
        ({"dtype": "float32"}, {"torch_dtype": "float32"}, False),  # ...unless fp32 is asked for
        ({"quantization": "awq"}, {"torch_dtype": "float16", "quantization_config": {"quant_method": "awq"}}, False),
    ],
    ids=["bf16", "bf16-fp8-online", "fp32-auto", "fp32-float32", "awq-prequantized"],
)
def test_weights_are_sized_at_the_served_dtype_and_quantization(vllm, config, fits):
    profile = ServingProfile.preset("l4", vllm={**vllm, "max_model_len": None})
    findings = check_model(profile, ModelFacts(weights_bytes=30 * 10**9, config=config))
    assert (errors_and_warnings(findings)[0] == []) is fits, findings


def test_kv_cache_budget_from_the_models_config():
    facts = ModelFacts(weights_bytes=16 * 10**9, config=LLAMA_8B)  # 8B in bf16 on an L4
    too_long = check_model(ServingProfile.preset("l4", vllm={"max_model_len": 65536}), facts)
    assert errors_and_warnings(too_long)[0] == ["vllm.max_model_len"]
    crowded = check_model(ServingProfile.preset("l4", vllm={"max_model_len": 8192, "max_num_seqs": 64}), facts)
    assert errors_and_warnings(crowded) == ([], ["vllm.max_num_seqs"])
    fits = check_model(ServingProfile.preset("l4", vllm={"max_model_len": 4096, "max_num_seqs": 8}), facts)
    assert fits == []


def test_weights_copied_to_memory_backed_storage_need_the_ram():
    profile = ServingProfile.preset("l4", vllm={"extra_args": ["--download-dir", "/dev/shm/models"]})
    assert errors_and_warnings(check_profile(profile, TARGET, "svc"))[1] == ["vllm.extra_args"]
    findings = check_model(profile, ModelFacts(weights_bytes=30 * 2**30))
    assert "memory_gib" in errors_and_warnings(findings)[0]


def test_preflight_error_lists_every_error_with_its_fix():
    profile = ServingProfile.preset("l4", vllm={"max_num_seqs": 2000}, image="vllm/vllm-openai:v1")
    with pytest.raises(PreflightError) as caught:
        raise_on_errors(check_profile(profile, TARGET, "svc"))
    text = str(caught.value)
    assert "vllm.max_num_seqs" in text and "image" in text and "(lesson 20)" in text and "(lesson 1)" in text


def test_preflight_judges_the_load_strategy_that_runs():
    """The RTX preset renders eager; a user's --safetensors-load-strategy replaces it, once, and preflight reads the
    user's value from what runs (issue 34)."""
    prefetch = ServingProfile.preset("rtx-pro-6000", vllm={"extra_args": ["--safetensors-load-strategy", "prefetch"]})
    args = list(service_of(prefetch).template.containers[0].args)
    assert [args[i + 1] for i, a in enumerate(args) if a == "--safetensors-load-strategy"] == ["prefetch"]
    assert check_profile(prefetch, TARGET, "svc") == [] and check_service(prefetch, service_of(prefetch)) == []
    lazy = ServingProfile.preset("rtx-pro-6000", vllm={"extra_args": ["--safetensors-load-strategy", "lazy"]})
    (finding,) = check_profile(lazy, TARGET, "svc")
    assert (finding.severity, finding.setting, finding.lesson) == ("warning", "vllm.extra_args", 12)
    assert "--safetensors-load-strategy lazy" in finding.message


def test_the_port_check_reads_the_last_port_as_vllm_does():
    profile = ServingProfile.preset("l4")
    service = service_of(profile, args=["vllm", "serve", "/mnt/models/m", "--port", "8080", "--port=8000"])
    assert [(f.setting, f.lesson) for f in check_service(profile, service)] == [("container_port", 4)]
