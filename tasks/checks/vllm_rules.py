"""What vLLM and the instance refuse, checked before any cloud call, from vLLM's own rules.

Rules are read from vLLM's source (the version we pin is blocks/images.py VLLM_PINNED_REF, v0.33.0); each cites
the file it mirrors. They return preflight Findings naming the setting's full path and the fix:

- config.json numbers are untrusted (a mirror or a broken upload): sizes and counts must be positive whole
  numbers of a plausible size before they drive KV memory, probes or costs;
- ``vllm.max_model_len`` against the length vLLM derives from config.json (its possible keys, ``model_max_length``,
  RoPE scaling), which vLLM refuses to exceed;
- tensor/pipeline/data parallelism against the GPUs one Cloud Run instance has, and tensor parallelism against
  the attention heads;
- the dtype and quantization against the GPU's compute capability, the checkpoint's own quantization and the CPU
  backend's limits;
- ``load_mode: runai-streamer`` with an image that has no Run:ai streamer;
- ``vllm.extra_args`` that repeat or contradict what the renderer sets (tasks/deploy/render.py), in every spelling
  vLLM's parser accepts;
- the safetensors load strategy that runs, against a Cloud Storage volume.

Rules that read a flag's value read it from the argv that runs (tasks/deploy/render.py running_value: the rendered
flags with extra_args merged in), not from a profile field a flag of the user's replaced.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from blocks.hardware import GPUS, GpuSpec
from blocks.profile import MANAGED_FLAGS, ServingProfile
from tasks.checks.findings import Finding, error, warning
from tasks.deploy.render import running_value, vllm_flags
from tasks.deploy.vllm_argv import canonical_flag, is_flag, parser_spelling

# Sizes and counts vLLM reads from config.json, with bounds well above any published model (Llama 3.1 405B has
# 126 layers, 128 heads, 16384 hidden, 53248 intermediate, 128k vocab; Llama 4 Scout 10M positions). A value
# above them is a broken or hostile file, not a model: it would size KV memory, probes and costs absurdly.
COUNT_BOUNDS: dict[str, int] = {
    "num_hidden_layers": 4096,
    "n_layer": 4096,
    "num_layers": 4096,
    "num_attention_heads": 65536,
    "n_head": 65536,
    "num_key_value_heads": 65536,
    "hidden_size": 1 << 20,
    "n_embd": 1 << 20,
    "head_dim": 1 << 16,
    "intermediate_size": 1 << 22,
    "vocab_size": 1 << 24,
}
# vllm/transformers_utils/model_arch_config_convertor.py (derive_max_model_len_and_key): the smallest of these
# keys is the model's length, then model_max_length overrides it (Command-R / Cohere).
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
MAX_LENGTH = 1 << 28  # 268M tokens: far beyond any context a model is trained or scaled to
# transformers' VERY_LARGE_INTEGER (int(1e30)): what save_pretrained writes for "no model_max_length"; not a length.
NO_LIMIT_SENTINEL = 10**30
MAX_ROPE_FACTOR = 1024.0
# vllm/config/model.py (_get_and_verify_max_len): these RoPE types do not scale the derived length.
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")
TRUE_VALUES = ("1", "true", "yes", "on")

# Every flag tasks/deploy/render.py vllm_flags renders, and the profile field it comes from (MANAGED_FLAGS is what the
# profile's own validator refuses verbatim; the renderer also sets --generation-config). --safetensors-load-strategy is
# rendered too but left out on purpose: the user's flag replaces the rendered one (tasks/deploy/vllm_argv.py), and
# check_load_strategy judges the value that runs.
RENDERED_FROM = {**MANAGED_FLAGS, "--generation-config": "vllm.generation_config"}
PARALLEL_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size")
REPEATABLE_FLAGS = {"--middleware"}  # action="append" in vLLM's frontend args: repeating it is meant
# QuantizationConfig.get_min_capability() of each method (vllm/model_executor/layers/quantization/*.py): fp8.py
# returns 80 (below 8.9 it runs weight-only through Marlin), awq.py 75, gptq.py 60, bitsandbytes.py 70.
QUANT_MIN_CAPABILITY = {"fp8": 80, "awq": 75, "gptq": 60, "bitsandbytes": 70}
# A checkpoint quantized with the key may be served by these kernels instead (vLLM's override_quantization_method).
QUANT_OVERRIDES = {
    "awq": {"awq_marlin", "marlin", "moe_wna16"},
    "gptq": {"gptq_marlin", "gptq_marlin_24", "gptq_bitblas", "marlin", "moe_wna16"},
    "fp8": {"fbgemm_fp8", "ptpc_fp8"},
}


@dataclass(frozen=True)
class ExtraArg:
    """One flag of vllm.extra_args: as written, as vLLM's parser reads it, and its value (if any)."""

    written: str
    flag: str
    value: str | None


# config.json -----------------------------------------------------------------------------------------------------
def text_config(config: dict) -> dict:
    """The language model's part of a config: ``text_config`` for multimodal models (Gemma 3/4, Llava ...), as
    vLLM's get_hf_text_config picks it, else the config itself."""
    sub = config.get("text_config")
    return sub if isinstance(sub, dict) else config


def _whole(value: object) -> int | None:
    """The value as a whole number, or None when it is not one (bools, strings, fractions, NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _is_sentinel(key: str, value: object) -> bool:
    number = _whole(value)
    return key == "model_max_length" and number is not None and number >= NO_LIMIT_SENTINEL


def _count_finding(where: str, key: str, value: object, bound: int) -> Finding | None:
    number = _whole(value)
    if number is None:
        return error(
            f"config.json: {where}{key}",
            f"{value!r} is not a whole number; the model's config.json is broken (vLLM would fail on it): fix the "
            "file in the repo or use another revision",
        )
    if number <= 0:
        return error(
            f"config.json: {where}{key}",
            f"{number} is not positive; the model's config.json is broken: fix the file in the repo or use "
            "another revision",
        )
    if number > bound:
        return error(
            f"config.json: {where}{key}",
            f"{number} is absurd (above {bound}); no real model has it, and it would size memory, probes and costs: "
            "check the repo (and hub_endpoint, if a mirror serves it) or use another revision",
        )
    return None


def _rope_tables(config: dict) -> list[dict] | None:
    """RoPE settings as a list of per-layer-type dicts (Transformers v5 nests them), or None when absent."""
    for holder in (config, text_config(config)):
        rope = holder.get("rope_parameters") or holder.get("rope_scaling")
        if rope is None:
            continue
        if not isinstance(rope, dict):
            return [{"invalid": rope}]
        if rope and all(isinstance(v, dict) for v in rope.values()):
            return list(rope.values())
        return [rope]
    return None


def check_config(config: object) -> list[Finding]:
    """config.json is a JSON object whose sizes, counts, lengths and RoPE factors are sane."""
    if not isinstance(config, dict):
        return [
            error(
                "config.json",
                f"is a JSON {type(config).__name__}, not an object of model settings: fix the file in the repo or "
                "use another revision",
            )
        ]
    findings: list[Finding] = []
    parts = [("", config)]
    if isinstance(config.get("text_config"), dict):
        parts.append(("text_config.", config["text_config"]))
    elif config.get("text_config") is not None:
        findings.append(error("config.json: text_config", "is not an object; fix the file in the repo"))
    for where, part in parts:
        bounds = {**COUNT_BOUNDS, **dict.fromkeys(LENGTH_KEYS, MAX_LENGTH)}
        for key, bound in bounds.items():
            if part.get(key) is not None and not _is_sentinel(key, part[key]):  # vLLM treats null as absent
                finding = _count_finding(where, key, part[key], bound)
                if finding:
                    findings.append(finding)
    for table in _rope_tables(config) or []:
        if "invalid" in table and len(table) == 1:
            findings.append(error("config.json: rope_scaling", f"{table['invalid']!r} is not an object"))
            continue
        factor = table.get("factor")
        if factor is not None and (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not math.isfinite(factor)
            or not 0 < factor <= MAX_ROPE_FACTOR
        ):
            findings.append(
                error(
                    "config.json: rope_scaling.factor",
                    f"{factor!r} is not a scaling factor between 0 and {MAX_ROPE_FACTOR:g}: fix the file in the repo "
                    "or use another revision",
                )
            )
        original = table.get("original_max_position_embeddings")
        if original is not None:
            finding = _count_finding("rope_scaling.", "original_max_position_embeddings", original, MAX_LENGTH)
            if finding:
                findings.append(finding)
    return findings


def derived_max_model_len(config: dict) -> tuple[int, str] | None:
    """The longest ``max_model_len`` vLLM accepts for this config, and where it comes from; None when the config
    names no length (vLLM then takes the user's value). Mirrors derive_max_model_len_and_key
    (vllm/transformers_utils/model_arch_config_convertor.py) and _get_and_verify_max_len (vllm/config/model.py),
    vLLM v0.33.0: the smallest length key, overridden by model_max_length, times the RoPE factor (yarn from its
    original_max_position_embeddings; su/longrope/llama3 unscaled; Gemma 3's length is scaled already)."""
    text = text_config(config)
    derived, key = math.inf, None
    for name in LENGTH_KEYS:
        value = _whole(text.get(name))
        if value is not None and value < derived and not _is_sentinel(name, value):
            derived, key = value, name
    if (model_max_length := _whole(text.get("model_max_length"))) and model_max_length < NO_LIMIT_SENTINEL:
        derived, key = model_max_length, "model_max_length"
    if derived == math.inf:
        return None
    source = f"{key}={derived}"
    tables = _rope_tables(config)
    model_type = str(config.get("model_type") or "")
    if tables and "gemma3" not in model_type:
        factor = 1.0
        for table in tables:
            rope_type = table.get("rope_type") or table.get("type")
            if rope_type in UNSCALED_ROPE_TYPES:
                continue
            factor = table.get("factor", factor)
            if rope_type == "yarn" and _whole(table.get("original_max_position_embeddings")):
                derived = _whole(table["original_max_position_embeddings"])
                source = f"rope_scaling.original_max_position_embeddings={derived}"
        factor = 1.0 if factor is None else float(factor)
        if factor != 1.0:
            source += f" x rope_scaling.factor {factor:g}"
        derived *= factor
    return int(derived), source


def check_max_model_len(profile: ServingProfile, config: dict) -> list[Finding]:
    """vllm.max_model_len within what the model supports, or vLLM refuses to start."""
    wanted = profile.vllm.max_model_len
    derived = derived_max_model_len(config)
    if wanted is None or derived is None or wanted <= derived[0]:
        return []
    limit, source = derived
    # vllm/config/model.py: "User-specified max_model_len (...) is greater than the derived max_model_len (...)";
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 turns the refusal into a warning (and nan or out-of-bounds errors later).
    if profile.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in TRUE_VALUES:
        return [
            warning(
                "vllm.max_model_len",
                f"{wanted} is above the model's {limit} ({source} in config.json); VLLM_ALLOW_LONG_MAX_MODEL_LEN lets "
                "vLLM start, but positions past it give nan or CUDA out-of-bounds errors",
            )
        ]
    return [
        error(
            "vllm.max_model_len",
            f"{wanted} is above what the model supports: {limit} ({source} in config.json); vLLM refuses to start "
            f"('User-specified max_model_len is greater than the derived max_model_len'). Set vllm.max_model_len to "
            f"{limit} or less",
        )
    ]


# vllm.extra_args -------------------------------------------------------------------------------------------------
def parsed_flags(argv: list[str]) -> Iterator[ExtraArg]:
    """The flags of an argv (extra_args, or the vLLM flags that run) with their values: ``--f=v``, or ``--f v`` when
    the next item is not a flag."""
    index = 0
    while index < len(argv):
        item = argv[index]
        index += 1
        if not is_flag(item):
            continue
        value = item.split("=", 1)[1] if "=" in item else None
        if value is None and index < len(argv) and not is_flag(argv[index]):
            value = argv[index]
            index += 1
        yield ExtraArg(item.split("=", 1)[0], parser_spelling(item), value)


def _shown(arg: ExtraArg) -> str:
    return f"{arg.written} {arg.value}" if arg.value is not None else arg.written


def _managed(flag: str) -> str | None:
    """The renderer's flag this one sets, in any spelling argparse accepts (argparse takes unambiguous prefixes of
    long flags, allow_abbrev; an ambiguous one is refused), with or without the --no- of a boolean."""
    name = canonical_flag(flag, RENDERED_FROM)
    return name if name in RENDERED_FROM else None


def check_extra_args(profile: ServingProfile) -> list[Finding]:
    """vllm.extra_args neither repeat what the renderer sets nor themselves, and hold nothing vLLM refuses."""
    args = profile.vllm.extra_args
    findings: list[Finding] = []
    if args and not is_flag(args[0]):
        findings.append(
            error(
                "vllm.extra_args",
                f"'{args[0]}' is not a flag: the model is rendered as vLLM's one positional argument, so vLLM would "
                "refuse it ('unrecognized arguments'); remove it, or give the flag it belongs to first",
            )
        )
    seen: dict[str, ExtraArg] = {}
    for arg in parsed_flags(args):
        managed = _managed(arg.flag)
        if managed:
            spelled = f"'{arg.written}'" + (f" (vLLM reads it as {managed})" if arg.written != managed else "")
            source = RENDERED_FROM[managed]
            fix = (
                f"the pipeline sets it {source}: remove it from extra_args"
                if source.startswith("(")
                else f"the pipeline renders it from {source}: set it there and remove it from extra_args"
            )
            findings.append(error("vllm.extra_args", f"{spelled} repeats a rendered flag; {fix}"))
        if arg.flag == "--config":
            findings.append(
                error(
                    "vllm.extra_args",
                    "'--config' loads flags from a YAML file preflight cannot see, which may repeat or contradict the "
                    "rendered ones; give its options as profile fields or in extra_args instead",
                )
            )
        if arg.flag in seen and arg.flag not in REPEATABLE_FLAGS:
            first = seen[arg.flag]
            how = "with different values" if first.value != arg.value else "twice"
            findings.append(
                error(
                    "vllm.extra_args",
                    f"{arg.flag} is given {how} ('{_shown(first)}' and '{_shown(arg)}'); vLLM keeps only the last: "
                    "keep one",
                )
            )
        seen.setdefault(arg.flag, arg)
    return findings


def parallel_sizes(profile: ServingProfile) -> tuple[dict[str, int], list[Finding]]:
    """Tensor, pipeline and data parallel sizes vLLM runs with (1 when absent; the last of a repeated flag, as vLLM's
    parser keeps), and findings for bad values."""
    sizes = dict.fromkeys(PARALLEL_FLAGS, 1)
    findings: list[Finding] = []
    for arg in parsed_flags(vllm_flags(profile, served_name="")):
        if arg.flag not in sizes:
            continue
        number = _whole_text(arg.value)
        if number is None or number < 1:
            findings.append(
                error(
                    "vllm.extra_args",
                    f"{arg.written} {arg.value!r}: vLLM wants a positive whole number ('invalid int value'); "
                    f"write e.g. [{arg.written!r}, '1'] or remove it",
                )
            )
            continue
        sizes[arg.flag] = number
    return sizes, findings


def _whole_text(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def check_parallelism(profile: ServingProfile) -> list[Finding]:
    """The GPUs tensor x pipeline x data parallelism asks for exist on one Cloud Run instance."""
    sizes, findings = parallel_sizes(profile)
    world = math.prod(sizes.values())
    if world == 1:
        return findings
    asked = " x ".join(f"{flag} {size}" for flag, size in sizes.items() if size > 1)
    if profile.gpu_type is None:
        # The CPU backend runs parallel ranks as worker processes sharing /dev/shm, which Cloud Run keeps tiny and
        # CPU mode runs vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, lesson 9).
        findings.append(
            error(
                "vllm.extra_args",
                f"{asked} asks for {world} parallel workers, but a CPU-only Cloud Run service runs vLLM in one "
                "process (lesson 9: no usable /dev/shm); remove the parallel flags",
                9,
            )
        )
        return findings
    gpu = GPUS[profile.gpu_type]
    if world > gpu.per_instance:
        # vLLM's executor refuses a world size above the visible GPUs ("please set tensor_parallel_size (...) to
        # less than max local gpu count"); Cloud Run attaches exactly one GPU per instance.
        findings.append(
            error(
                "vllm.extra_args",
                f"{asked} needs {world} GPUs per instance, but a Cloud Run {profile.gpu_type} instance has "
                f"{gpu.per_instance}; remove the parallel flags, and for a model too big for one GPU choose a bigger "
                "gpu_type (nvidia-rtx-pro-6000) or a quantized model",
            )
        )
    return findings


def check_parallel_heads(profile: ServingProfile, config: dict) -> list[Finding]:
    """Tensor parallelism splits attention heads evenly (vllm/config/model.py verify_with_parallel_config)."""
    tp = parallel_sizes(profile)[0]["--tensor-parallel-size"]
    heads = _whole(text_config(config).get("num_attention_heads"))
    if tp == 1 or not heads or heads % tp == 0:
        return []
    fitting = [n for n in range(1, tp + 1) if heads % n == 0]
    return [
        error(
            "vllm.extra_args",
            f"--tensor-parallel-size {tp} does not divide the model's {heads} attention heads; vLLM refuses it ('Total "
            f"number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})'): use "
            f"{max(fitting)} or another divisor",
        )
    ]


# dtype, quantization, load mode ----------------------------------------------------------------------------------
def check_gpu_support(
    dtype: str, quantization: str | None, gpu_name: str, capability: tuple[int, int]
) -> list[Finding]:
    """The dtype and quantization method run on a GPU of this compute capability (vLLM's platform checks)."""
    findings: list[Finding] = []
    major, minor = capability
    level = major * 10 + minor
    if dtype == "bfloat16" and level < 80:
        # vllm/platforms/cuda.py: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0."
        findings.append(
            error(
                "vllm.dtype",
                f"bfloat16 needs compute capability 8.0, {gpu_name} has {major}.{minor}; vLLM refuses it. Set "
                "vllm.dtype to float16",
            )
        )
    need = QUANT_MIN_CAPABILITY.get(quantization or "")
    if need is not None and level < need:
        # vllm/model_executor/model_loader: "The quantization method X is not supported for the current GPU.
        # Minimum capability: N. Current capability: M."
        findings.append(
            error(
                "vllm.quantization",
                f"{quantization} needs compute capability {need // 10}.{need % 10}, {gpu_name} has {major}.{minor}; "
                "vLLM refuses it. Choose another quantization or a newer gpu_type",
            )
        )
    return findings


def check_cpu_support(profile: ServingProfile) -> list[Finding]:
    """What vLLM's CPU backend refuses (vllm/platforms/cpu.py CpuPlatform.check_and_update_config)."""
    opts = profile.vllm
    if opts.kv_cache_dtype == "auto" or not (opts.enable_prefix_caching or opts.enable_chunked_prefill):
        return []
    on = [n for n, v in (("enable_prefix_caching", opts.enable_prefix_caching),
                         ("enable_chunked_prefill", opts.enable_chunked_prefill)) if v]  # fmt: skip
    return [
        error(
            "vllm.kv_cache_dtype",
            f"{opts.kv_cache_dtype} with {' and '.join('vllm.' + n for n in on)} on the CPU backend: vLLM refuses to "
            "start ('Chunked-prefill and prefix-cache on the CPU backend is not compatible with FP8 KV cache'). Set "
            "vllm.kv_cache_dtype to auto (the CPU backend does not quantize the KV cache anyway)",
        )
    ]


def image_lacks_streamer(profile: ServingProfile) -> str | None:
    """Why the profile's image has no Run:ai model streamer, or None when it has one (or we cannot tell).

    vLLM's docker/Dockerfile.cpu (the vllm-cpu recipe, v0.33.0) installs requirements/cpu.txt only, without the
    ``runai`` extra that --load-format runai_streamer imports (runai-model-streamer); vLLM's CPU release images are
    built from it."""
    build = profile.build
    if build is not None and (build.recipe == "vllm-cpu" or build.dockerfile.endswith("Dockerfile.cpu")):
        return f"the {build.recipe or build.dockerfile} image is built from vLLM's Dockerfile.cpu"
    if profile.image and "vllm-cpu" in profile.image.split("@")[0]:
        return f"{profile.image} is a vLLM CPU image"
    return None


def check_load_mode(profile: ServingProfile) -> list[Finding]:
    """runai-streamer only with an image that has the streamer."""
    if profile.load_mode != "runai-streamer":
        return []
    reason = image_lacks_streamer(profile)
    if reason is None:
        return []
    return [
        error(
            "load_mode",
            f"runai-streamer needs vLLM's runai extra, but {reason}, which has none: vLLM would fail to import "
            "runai_model_streamer. Use load_mode gcs-volume, or build an image that installs vllm[runai]",
            15,
        )
    ]


def check_load_strategy(profile: ServingProfile) -> list[Finding]:
    """The safetensors load strategy that runs (a flag in extra_args replaces the rendered one) against the Cloud
    Storage volume: lazy memory-maps the files, and gcsfuse turns mmap's small random reads into a load many times
    slower than reading each file through (safetensors issue 562, vLLM PR 24469), while the startup probe window is
    sized from load_rate_mb_s (tasks/deploy/render.py probe_failure_threshold), which assumes reading through."""
    if profile.load_mode != "gcs-volume" or running_value(profile, "--safetensors-load-strategy") != "lazy":
        return []
    by_user = any(arg.flag == "--safetensors-load-strategy" for arg in parsed_flags(profile.vllm.extra_args))
    return [
        warning(
            "vllm.extra_args" if by_user else "vllm.safetensors_load_strategy",
            "vLLM runs with --safetensors-load-strategy lazy on a Cloud Storage volume: memory-mapped reads over "
            f"gcsfuse are many times slower than the {profile.load_rate_mb_s:g} MB/s the startup probe is sized "
            "from, so the revision may be stopped before its weights are loaded; use eager (the default here), or "
            "lower load_rate_mb_s to what lazy loading measures",
            12,
        )
    ]


def check_quantization_matches(profile: ServingProfile, config: dict) -> list[Finding]:
    """vllm.quantization agrees with the checkpoint's (vllm/config/model.py _verify_quantization)."""
    wanted = running_value(profile, "--quantization")
    quant = config.get("quantization_config") or text_config(config).get("quantization_config")
    if not wanted or not isinstance(quant, dict) or not quant.get("quant_method"):
        return []
    method = str(quant["quant_method"]).lower().replace("compressed_tensors", "compressed-tensors")
    if wanted == method or wanted in QUANT_OVERRIDES.get(method, set()):
        return []
    return [
        error(
            "vllm.quantization",
            f"{wanted} does not match the checkpoint's quantization ({method}, config.json quantization_config); vLLM "
            "refuses it ('Quantization method specified in the model config does not match the quantization method "
            f"specified in the `quantization` argument'). Remove vllm.quantization or set it to {method}",
        )
    ]


def _served_dtype(profile: ServingProfile, config: dict | None) -> str:
    if profile.vllm.dtype != "auto":
        return profile.vllm.dtype
    stored = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "")
    return "bfloat16" if stored == "bfloat16" else "float16"


# Entry points for tasks/checks/preflight.py ------------------------------------------------------------------
def profile_rules(profile: ServingProfile) -> list[Finding]:
    """Rules on the settings alone (check_profile)."""
    findings = check_extra_args(profile) + check_parallelism(profile) + check_load_mode(profile)
    findings += check_load_strategy(profile)
    if profile.gpu_type is None:
        return findings + check_cpu_support(profile)
    gpu: GpuSpec = GPUS[profile.gpu_type]
    quantization = running_value(profile, "--quantization")
    dtype = profile.vllm.dtype if profile.vllm.dtype != "auto" else ""
    return findings + check_gpu_support(dtype, quantization, profile.gpu_type, gpu.compute_capability)


def model_rules(profile: ServingProfile, config: object) -> list[Finding]:
    """Rules that need config.json (check_model): a broken config stops here, before its numbers are used."""
    if config is None:
        return []
    findings = check_config(config)
    if findings:
        return findings
    assert isinstance(config, dict)
    findings = check_max_model_len(profile, config) + check_parallel_heads(profile, config)
    findings += check_quantization_matches(profile, config)
    if profile.gpu_type is not None and profile.vllm.dtype == "auto":
        gpu = GPUS[profile.gpu_type]
        findings += check_gpu_support(_served_dtype(profile, config), None, profile.gpu_type, gpu.compute_capability)
    return findings
