"""Bad input vLLM or the instance would refuse (issue 14, part 2), and config.json numbers from the Hub (part 1).

Each case runs promote-model in-process against the sandbox with ONE bad input and checks that the refusal names
the setting's full path and the fix, before any cloud write. Without these rules each case staged the weights,
deployed, and left a candidate revision that never became ready (vLLM exits on the setting at boot).
"""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from tests.support.bad_input import fails_cleanly, new_repo, promote, saved_profile

pytestmark = pytest.mark.prefect
_profiles = itertools.count()
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def repo_with_config(sb, name: str, config: object) -> str:
    """A small public repo whose config.json is replaced, as a mirror or a broken upload could serve it."""
    repo_id = new_repo(sb, name)
    data = base64.b64encode(json.dumps(config).encode()).decode()
    sb.hub("POST", f"/repos/{repo_id}/commits", json={"files": {"config.json": data}, "message": "edit config"})
    return repo_id


def repo_with_context(sb, name: str, context_length: int) -> str:
    """A generated repo whose config.json says max_position_embeddings = context_length (ModelSpec)."""
    repo_id = f"badinput/{name}-{context_length}"
    spec = {"weight_bytes": 200_000, "shards": 1, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "replace": True, "context_length": context_length, **spec})
    return repo_id


def test_max_model_len_above_the_models_context(sb, flow_env):
    # The l4 preset asks for 8192 tokens; this model was trained for 2048 and vLLM refuses to start.
    model = repo_with_context(sb, "short-context", 2048)
    fails_cleanly(sb, lambda: promote(model=model), "vllm.max_model_len", "Set vllm.max_model_len to 2048 or less")


def test_max_model_len_above_the_rope_scaled_context(sb, flow_env):
    config = {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    model = repo_with_config(sb, "rope-scaled", config)
    profile = saved_profile("bi-l4-max-len-16k", vllm={"max_model_len": 16384})
    message = fails_cleanly(
        sb, lambda: promote(model=model, profile=profile), "vllm.max_model_len", "Set vllm.max_model_len to 8192"
    )
    assert "rope_scaling.factor 2" in message


def test_max_model_len_within_the_rope_scaled_context_passes_preflight(sb, flow_env):
    config = {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    model = repo_with_config(sb, "rope-scaled-ok", config)
    report = promote(model=model, dry_run=True)  # 8192 = 4096 x 2: no refusal
    assert report.outcome == "dry-run"


@pytest.mark.parametrize(
    ("config", "field", "fix"),
    [
        pytest.param({**LLAMA, "num_hidden_layers": 10**12}, "config.json: num_hidden_layers", "absurd", id="layers"),
        pytest.param(
            {**LLAMA, "num_attention_heads": 0}, "config.json: num_attention_heads", "not positive", id="heads"
        ),
        pytest.param(
            {**LLAMA, "max_position_embeddings": "8192"},
            "config.json: max_position_embeddings",
            "not a whole number",
            id="length-string",
        ),
        pytest.param(
            {**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": -4}},
            "config.json: rope_scaling.factor",
            "fix the file",
            id="rope-factor",
        ),
        # Refused when the Hub listing is read (tasks/weights/hub_download.py), before the vLLM rules see it.
        pytest.param(["not", "a", "config"], "config.json", "is not a JSON object", id="not-an-object"),
    ],
)
def test_config_json_numbers_are_sanity_checked(sb, flow_env, config, field, fix):
    model = repo_with_config(sb, "broken-config", config)
    fails_cleanly(sb, lambda: promote(model=model), field, fix)


@pytest.mark.parametrize(
    ("extra_args", "fix"),
    [
        pytest.param(["--tensor-parallel-size", "2"], "has 1", id="tp-2"),
        pytest.param(["-pp", "2"], "has 1", id="pp-2"),
        pytest.param(["--max_model_len", "4096"], "set it there and remove it from extra_args", id="underscore"),
        pytest.param(["--served-model", "other"], "remove it from extra_args", id="abbreviated"),
        pytest.param(["-q", "awq"], "vllm.quantization", id="short-quantization"),
        pytest.param(["--generation-config", "vllm"], "vllm.generation_config", id="generation-config"),
        pytest.param(["--trust-remote-code", "--trust_remote_code"], "keep one", id="twice"),
        pytest.param(["org/other-model"], "not a flag", id="positional"),
    ],
)
def test_extra_args_vllm_or_the_instance_refuses(sb, flow_env, extra_args, fix):
    profile = saved_profile(f"bi-l4-extra-{next(_profiles)}", vllm={"extra_args": extra_args})
    fails_cleanly(sb, lambda: promote(profile=profile), "vllm.extra_args", fix)


def test_tensor_parallel_on_the_biggest_gpu(sb, flow_env):
    # The RTX Pro 6000 instance has one GPU too: parallelism is never possible on Cloud Run.
    profile = saved_profile("bi-rtx-tp-3", "rtx-pro-6000", vllm={"extra_args": ["-tp", "3"]})
    message = fails_cleanly(sb, lambda: promote(profile=profile), "vllm.extra_args", "has 1")
    assert "--tensor-parallel-size 3" in message


def test_quantization_that_contradicts_the_checkpoint(sb, flow_env):
    model = repo_with_config(sb, "awq-model", {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4}})
    profile = saved_profile("bi-l4-gptq", vllm={"quantization": "gptq"})
    fails_cleanly(sb, lambda: promote(model=model, profile=profile), "vllm.quantization", "Remove vllm.quantization")


def test_runai_streamer_with_the_cpu_image(sb, flow_env):
    profile = saved_profile("bi-cpu-streamer", "cpu")
    fails_cleanly(
        sb, lambda: promote(profile=profile, load_mode="runai-streamer"), "load_mode", "Use load_mode gcs-volume"
    )


def test_fp8_kv_cache_on_the_cpu_backend(sb, flow_env):
    profile = saved_profile("bi-cpu-fp8-kv", "cpu", vllm={"max_model_len": 2048, "kv_cache_dtype": "fp8"})
    fails_cleanly(sb, lambda: promote(profile=profile), "vllm.kv_cache_dtype", "Set vllm.kv_cache_dtype to auto")
