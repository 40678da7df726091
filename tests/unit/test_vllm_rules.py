"""vLLM's own refusals as preflight findings: each names the setting's full path and the fix (issue 14, part 2),
and config.json numbers are bounded before they size anything (issue 14, part 1)."""

from __future__ import annotations

import pytest

from blocks import GcpTarget, ServingProfile
from blocks.hardware import GPUS
from tasks.checks.preflight import ModelFacts, check_model, check_profile
from tasks.checks.vllm_rules import (
    RENDERED_FROM,
    check_config,
    check_gpu_support,
    derived_max_model_len,
    model_rules,
    profile_rules,
)
from tasks.deploy.render import vllm_flags

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
GIB = 2**30


def errors(findings) -> list[str]:
    return [f"{f.setting}: {f.message}" for f in findings if f.severity == "error"]


def only_error(findings, setting: str, *texts: str) -> str:
    found = errors(findings)
    assert len(found) == 1, found
    assert found[0].startswith(setting + ": "), found
    for text in texts:
        assert text in found[0], found[0]
    return found[0]


def l4(**vllm) -> ServingProfile:
    return ServingProfile.preset("l4", vllm=vllm)


# The presets and an ordinary model pass ----------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["l4", "rtx-pro-6000", "cpu"])
def test_presets_pass(preset):
    profile = ServingProfile.preset(preset)
    assert errors(profile_rules(profile)) == []
    assert errors(model_rules(profile, {**LLAMA, "max_position_embeddings": 32768})) == []


def test_every_rendered_flag_is_known_to_the_rules():
    """A flag the renderer adds without a rule would let extra_args repeat it unnoticed."""
    profile = ServingProfile.preset(
        "l4", load_mode="runai-streamer",
        vllm={"quantization": "fp8", "kv_cache_dtype": "fp8", "tool_call_parser": "hermes",
              "enable_auto_tool_choice": True, "reasoning_parser": "deepseek_r1"},
    )  # fmt: skip
    rendered = {f.removeprefix("--no-").replace("--", "") for f in vllm_flags(profile, "x") if f.startswith("--")}
    assert {f"--{f}" for f in rendered} <= set(RENDERED_FROM)


# max_model_len against the model ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"max_position_embeddings": 4096}, 4096),
        ({"n_positions": 1024, "max_position_embeddings": 2048}, 1024),  # the smallest key wins
        ({"max_position_embeddings": 131072, "model_max_length": 8192}, 8192),  # Command-R: model_max_length wins
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
            131072,
        ),
        ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 8192),
        ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
        (
            {
                "model_type": "gemma3",
                "text_config": {"max_position_embeddings": 131072},
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            },
            131072,
        ),
        ({"model_type": "gemma4", "text_config": {"max_position_embeddings": 32768}}, 32768),
        ({"seq_length": 2048}, 2048),  # ChatGLM
    ],
)
def test_derived_max_model_len_as_vllm_computes_it(config, limit):
    assert derived_max_model_len(config)[0] == limit


def test_no_length_key_means_no_limit():
    assert derived_max_model_len({"hidden_size": 64}) is None
    assert errors(model_rules(l4(max_model_len=65536), {"hidden_size": 64})) == []


def test_max_model_len_above_the_model_is_refused_with_the_limit():
    message = only_error(
        model_rules(l4(max_model_len=16384), LLAMA), "vllm.max_model_len", "16384", "max_position_embeddings=8192",
        "Set vllm.max_model_len to 8192 or less",
    )  # fmt: skip
    assert "User-specified max_model_len" in message


def test_max_model_len_within_rope_scaling_passes():
    config = {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert errors(model_rules(l4(max_model_len=16384), config)) == []
    only_error(model_rules(l4(max_model_len=16385), config), "vllm.max_model_len", "16384", "rope_scaling.factor 4")


def test_text_config_of_a_multimodal_model_bounds_max_model_len():
    config = {"model_type": "gemma4", "text_config": {**LLAMA, "max_position_embeddings": 4096}}
    only_error(model_rules(l4(max_model_len=8192), config), "vllm.max_model_len", "4096 or less")


def test_vllm_allow_long_max_model_len_turns_the_refusal_into_a_warning():
    profile = ServingProfile.preset("l4", env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, vllm={"max_model_len": 16384})
    findings = model_rules(profile, LLAMA)
    assert errors(findings) == []
    assert [f.setting for f in findings] == ["vllm.max_model_len"]


def test_check_model_reports_the_max_model_len_finding():
    with_model = check_model(l4(max_model_len=16384), ModelFacts(GIB, LLAMA))
    assert "vllm.max_model_len" in [f.setting for f in with_model if f.severity == "error"]


# config.json numbers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("num_hidden_layers", 10**12, "absurd"),
        ("num_hidden_layers", 0, "not positive"),
        ("num_attention_heads", -8, "not positive"),
        ("hidden_size", "4096", "not a whole number"),
        ("num_key_value_heads", 2.5, "not a whole number"),
        ("max_position_embeddings", 10**15, "absurd"),
        ("max_position_embeddings", True, "not a whole number"),
        ("vocab_size", [32000], "not a whole number"),
        ("n_positions", float("nan"), "not a whole number"),
    ],
)
def test_config_numbers_are_bounded(key, value, text):
    only_error(check_config({**LLAMA, key: value}), f"config.json: {key}", text, "another revision")


def test_config_numbers_inside_text_config_are_bounded():
    config = {"model_type": "gemma4", "text_config": {**LLAMA, "num_hidden_layers": 10**9}}
    only_error(check_config(config), "config.json: text_config.num_hidden_layers", "absurd")


@pytest.mark.parametrize("factor", [0, -2.0, 1e9, "4", float("inf")])
def test_rope_factor_is_bounded(factor):
    config = {**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": factor}}
    only_error(check_config(config), "config.json: rope_scaling.factor", "fix the file")


def test_transformers_no_limit_sentinel_is_not_absurd():
    config = {**LLAMA, "model_max_length": 1000000000000000019884624838656}
    assert check_config(config) == []
    assert derived_max_model_len(config) == (8192, "max_position_embeddings=8192")


def test_a_config_that_is_not_an_object_is_refused():
    only_error(check_config(["llama"]), "config.json", "not an object")


def test_a_broken_config_stops_check_model_before_its_numbers_are_used():
    """Without the bound, 10**12 layers made the KV budget check report terabytes instead of naming the file."""
    findings = check_model(l4(), ModelFacts(GIB, {**LLAMA, "num_hidden_layers": 10**12}))
    only_error(findings, "config.json: num_hidden_layers", "absurd")
    only_error(check_model(l4(), ModelFacts(GIB, [1, 2])), "config.json", "not an object")  # type: ignore[arg-type]


# parallelism ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [["--tensor-parallel-size", "2"], ["-tp", "2"], ["--tensor_parallel_size=4"], ["-pp", "2"], ["-dp", "2"]],
)
def test_parallelism_above_the_gpus_of_an_instance_is_refused(extra):
    only_error(profile_rules(l4(extra_args=extra)), "vllm.extra_args", "GPUs per instance", "has 1")


def test_parallelism_on_cpu_is_refused():
    profile = ServingProfile.preset("cpu", vllm={"max_model_len": 2048, "extra_args": ["-tp", "2"]})
    only_error(profile_rules(profile), "vllm.extra_args", "one process", "remove the parallel flags")


def test_parallel_size_must_be_a_whole_number():
    only_error(profile_rules(l4(extra_args=["-tp", "two"])), "vllm.extra_args", "positive whole number")


def test_tensor_parallel_must_divide_the_attention_heads():
    findings = model_rules(l4(extra_args=["-tp", "3"]), LLAMA)
    only_error(findings, "vllm.extra_args", "does not divide the model's 32 attention heads", "use 2")


def test_one_gpu_per_instance_in_the_catalogue():
    assert {gpu.per_instance for gpu in GPUS.values()} == {1}


# dtype and quantization ------------------------------------------------------------------------------------
def test_catalogue_gpus_run_bfloat16_and_fp8():
    for name, gpu in GPUS.items():
        assert check_gpu_support("bfloat16", "fp8", name, gpu.compute_capability) == []


def test_bfloat16_below_compute_capability_8_is_refused():
    only_error(check_gpu_support("bfloat16", None, "nvidia-t4", (7, 5)), "vllm.dtype", "8.0", "float16")


@pytest.mark.parametrize(("method", "need"), [("fp8", "8.0"), ("bitsandbytes", "7.0"), ("awq", "7.5")])
def test_quantization_below_its_minimum_capability_is_refused(method, need):
    only_error(check_gpu_support("float16", method, "old-gpu", (6, 1)), "vllm.quantization", need)


def test_quantization_that_contradicts_the_checkpoint_is_refused():
    config = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4}}
    only_error(model_rules(l4(quantization="gptq"), config), "vllm.quantization", "awq", "Remove vllm.quantization")
    assert errors(model_rules(l4(quantization="awq_marlin"), config)) == []  # vLLM's own override
    assert errors(model_rules(l4(), config)) == []


def test_fp8_kv_cache_with_prefix_caching_on_cpu_is_refused():
    profile = ServingProfile.preset("cpu", vllm={"max_model_len": 2048, "kv_cache_dtype": "fp8"})
    only_error(profile_rules(profile), "vllm.kv_cache_dtype", "CPU backend", "auto")
    ok = ServingProfile.preset(
        "cpu",
        vllm={"max_model_len": 2048, "kv_cache_dtype": "fp8", "enable_prefix_caching": False,
              "enable_chunked_prefill": False},
    )  # fmt: skip
    assert errors(profile_rules(ok)) == []


# load mode -------------------------------------------------------------------------------------------------
def test_runai_streamer_with_the_cpu_image_is_refused():
    profile = ServingProfile.preset("cpu", load_mode="runai-streamer")
    only_error(profile_rules(profile), "load_mode", "runai", "gcs-volume")
    git_cpu = ServingProfile.preset(
        "cpu", load_mode="runai-streamer",
        build={"git_url": "https://github.com/vllm-project/vllm.git", "git_ref": "v0.33.0",
               "dockerfile": "docker/Dockerfile.cpu"},
    )  # fmt: skip
    only_error(profile_rules(git_cpu), "load_mode", "Dockerfile.cpu")


def test_runai_streamer_with_the_model_garden_image_passes():
    assert errors(profile_rules(ServingProfile.preset("l4", load_mode="runai-streamer"))) == []


# extra_args ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "flag", "field"),
    [
        (["--max_model_len", "4096"], "--max-model-len", "vllm.max_model_len"),
        (["--max-model", "4096"], "--max-model-len", "vllm.max_model_len"),
        (["--served_model_name=x"], "--served-model-name", "remove it"),
        (["-q", "awq"], "--quantization", "vllm.quantization"),
        (["--gpu_memory_utilization", "0.5"], "--gpu-memory-utilization", "vllm.gpu_memory_utilization"),
        (["--generation-config", "vllm"], "--generation-config", "vllm.generation_config"),
        (["--no-enable_prefix_caching"], "--enable-prefix-caching", "vllm.enable_prefix_caching"),
        (["--load_format", "safetensors"], "--load-format", "load_mode"),
    ],
)
def test_extra_args_that_repeat_a_rendered_flag_in_any_spelling(extra, flag, field):
    only_error(profile_rules(l4(extra_args=extra)), "vllm.extra_args", flag, field, "extra_args")


def test_extra_args_given_twice_are_refused():
    extra = ["--limit-mm-per-prompt", '{"image":4}', "--limit_mm_per_prompt", '{"image":2}']
    only_error(profile_rules(l4(extra_args=extra)), "vllm.extra_args", "different values", "keep one")
    only_error(profile_rules(l4(extra_args=["--trust-remote-code", "--trust-remote-code"])), "vllm.extra_args", "twice")


def test_a_positional_in_extra_args_is_refused():
    only_error(profile_rules(l4(extra_args=["google/gemma-3-1b-it"])), "vllm.extra_args", "not a flag")


def test_a_config_file_in_extra_args_is_refused():
    only_error(profile_rules(l4(extra_args=["--config", "/etc/vllm.yaml"])), "vllm.extra_args", "--config")


def test_ordinary_extra_args_pass():
    extra = ["--limit-mm-per-prompt", '{"image":4}', "--trust-remote-code", "--max-num-batched-tokens", "4096"]
    assert errors(profile_rules(l4(extra_args=extra))) == []


def test_check_profile_reports_the_rules():
    findings = check_profile(l4(extra_args=["-tp", "2"]), TARGET, "svc")
    assert [f.setting for f in findings if f.severity == "error"] == ["vllm.extra_args"]


# The value that runs -------------------------------------------------------------------------------------------
def rtx(**vllm) -> ServingProfile:
    return ServingProfile.preset("rtx-pro-6000", vllm=vllm)


def load_strategy_findings(profile: ServingProfile) -> list[tuple[str, str]]:
    return [(f.severity, f.setting) for f in profile_rules(profile) if "load-strategy" in f.message]


def test_the_load_strategy_check_sees_the_users_flag_not_the_rendered_one():
    """The RTX preset renders eager; the user's flag replaces it, and the check judges what runs (issue 34)."""
    assert load_strategy_findings(rtx(extra_args=["--safetensors-load-strategy", "prefetch"])) == []
    assert load_strategy_findings(rtx(extra_args=["--safetensors-load-strategy", "lazy"])) == [
        ("warning", "vllm.extra_args")
    ]
    # The field says lazy, the user's flag says prefetch: prefetch runs, so nothing to warn about.
    overridden = rtx(safetensors_load_strategy="lazy", extra_args=["--safetensors-load-strategy=prefetch"])
    assert load_strategy_findings(overridden) == []
    assert load_strategy_findings(rtx(safetensors_load_strategy="lazy")) == [
        ("warning", "vllm.safetensors_load_strategy")
    ]


def test_the_load_strategy_does_not_matter_to_the_streamer():
    streamer = ServingProfile.preset("l4", load_mode="runai-streamer", vllm={"safetensors_load_strategy": "lazy"})
    assert load_strategy_findings(streamer) == []


def test_the_rules_read_the_quantization_that_runs():
    """-q in extra_args replaces the rendered --quantization (and is refused as a repeat); the checkpoint check
    judges the method that would run, the user's."""
    profile = l4(quantization="fp8", extra_args=["-q", "awq"])
    flags = vllm_flags(profile, "x")
    assert "--quantization" not in flags and flags[flags.index("-q") + 1] == "awq"
    gptq = {**LLAMA, "quantization_config": {"quant_method": "gptq"}}
    assert [e for e in errors(model_rules(profile, gptq)) if e.startswith("vllm.quantization: awq does not match")]
