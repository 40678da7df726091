"""The instance's hardware as vLLM meets it: platform detection, the CUDA driver, GPU memory and KV cache.

Cloud Run gives one GPU per instance (FACTS.md): an L4 with driver 535 (CUDA 12.2) or an RTX Pro 6000
with driver 580 (CUDA 13.0). The image's CUDA build must not be newer than the driver (field lesson 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.vllm.cli import ServeArgs
from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.instance import InstanceEnv
from sandbox.vllm.model import ModelInfo, derived_max_model_len, text_config
from sandbox.vllm.timing import GIB

# What torch reports as total device memory.
GPU_MEMORY_GIB = {"nvidia-l4": 22.03, "nvidia-rtx-pro-6000": 94.97}
GPUS_PER_INSTANCE = 1
# Peak activation memory of the profiling run plus non-torch allocations, left out of the KV cache.
PROFILE_OVERHEAD_GIB = 1.0
CPU_KVCACHE_DEFAULT_GIB = 4.0
_DRIVER_TOO_OLD = (
    "The NVIDIA driver on your system is too old (found version {found}). Please update your GPU driver by "
    "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
    "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your "
    "version of the CUDA driver."
)


def device_name(env: InstanceEnv) -> str:
    """``cpu`` or the accelerator type, as the decode-speed table keys it."""
    return "cpu" if env.cpu_mode else env.accelerator


def check_platform(env: InstanceEnv) -> None:
    """A CUDA build of vLLM on an instance without a GPU cannot pick a device."""
    if not env.cpu_mode and not env.accelerator:
        raise VllmStartupError("RuntimeError", "Failed to infer device type", where="vllm/config/device.py")


def check_cuda_driver(env: InstanceEnv) -> None:
    """torch's CUDA init fails when the image was built for a newer CUDA than the driver supports."""
    if env.cpu_mode:
        return
    if env.image_cuda > env.driver_cuda:
        raise VllmStartupError(
            "RuntimeError",
            _DRIVER_TOO_OLD.format(found=env.driver_cuda),
            where="torch/cuda/__init__.py",
        )


def check_parallelism(args: ServeArgs, env: InstanceEnv) -> None:
    """Tensor and pipeline parallelism need as many GPUs as their product; Cloud Run attaches one."""
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if not env.cpu_mode and world > GPUS_PER_INSTANCE:
        raise VllmStartupError(
            "ValueError",
            f"World size ({world}) is larger than the number of available GPUs ({GPUS_PER_INSTANCE}) in this node.",
            where="vllm/v1/executor/multiproc_executor.py",
        )


def check_max_model_len(args: ServeArgs, config: dict[str, Any], env: InstanceEnv) -> int:
    """The context length to serve: ``--max-model-len`` if the config allows it, else the config's own."""
    derived, key = derived_max_model_len(config)
    if args.max_model_len is None:
        return derived
    allow_long = env.env_flag("VLLM_ALLOW_LONG_MAX_MODEL_LEN").lower() in ("1", "true")
    if args.max_model_len > derived and not allow_long:
        raise VllmStartupError(
            "ValueError",
            f"User-specified max_model_len ({args.max_model_len}) is greater than the derived max_model_len "
            f"({key}={derived} or model_max_length=None in model's config.json). To allow overriding this "
            "maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be "
            "used with extreme caution. If the model uses relative position encoding (RoPE), positions exceeding "
            "derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
            "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.",
            where="vllm/config/model.py",
        )
    return args.max_model_len


def kv_bytes_per_token(config: dict[str, Any], args: ServeArgs) -> int | None:
    """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes; None if the config is vague."""
    cfg = text_config(config)
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") // heads if cfg.get("hidden_size") and heads else None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)):
        return None
    if args.kv_cache_dtype.startswith("fp8"):
        dtype_bytes = 1
    elif args.dtype in ("float", "float32"):
        dtype_bytes = 4
    else:
        dtype_bytes = 2
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class KvCache:
    """The KV cache vLLM allocates after profiling."""

    available_gib: float
    tokens: int | None

    def max_concurrency(self, max_model_len: int) -> float | None:
        """How many full-length requests fit at once (vLLM logs it)."""
        return None if self.tokens is None else self.tokens / max_model_len


def cpu_kvcache_gib(env: InstanceEnv, warn: Callable[[str], None]) -> float:
    """``VLLM_CPU_KVCACHE_SPACE`` in GiB; unset or 0 means vLLM's default with a warning."""
    raw = env.env_flag("VLLM_CPU_KVCACHE_SPACE", "0")
    try:
        value = float(raw)
    except ValueError:
        raise VllmStartupError(
            "ValueError", f"could not convert string to float: {raw!r}", where="vllm/envs.py"
        ) from None
    if value <= 0:
        warn(
            "Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using "
            f"{CPU_KVCACHE_DEFAULT_GIB:g} by default."
        )
        return CPU_KVCACHE_DEFAULT_GIB
    return value


def check_weights_fit(model: ModelInfo, args: ServeArgs, env: InstanceEnv) -> None:
    """Weights larger than the GPU memory vLLM may use fail while loading."""
    if env.cpu_mode:
        return
    budget = GPU_MEMORY_GIB.get(env.accelerator, 0.0) * args.gpu_memory_utilization
    weights_gib = model.weight_bytes / GIB
    if weights_gib > budget:
        total = GPU_MEMORY_GIB.get(env.accelerator, 0.0)
        raise VllmStartupError(
            "torch.OutOfMemoryError",
            f"CUDA out of memory. Tried to allocate {weights_gib - budget:.2f} GiB. GPU 0 has a total capacity "
            f"of {total:.2f} GiB of which {max(total - budget, 0):.2f} GiB is free.",
            where="vllm/model_executor/model_loader/default_loader.py",
        )


def allocate_kv_cache(
    model: ModelInfo, args: ServeArgs, env: InstanceEnv, max_model_len: int, warn: Callable[[str], None]
) -> KvCache:
    """Size the KV cache like vLLM's profiler, failing when one full-length request does not fit."""
    if env.cpu_mode:
        available = cpu_kvcache_gib(env, warn)
    else:
        total = GPU_MEMORY_GIB.get(env.accelerator, 0.0)
        available = total * args.gpu_memory_utilization - model.weight_bytes / GIB - PROFILE_OVERHEAD_GIB
        if available <= 0:
            raise VllmStartupError(
                "ValueError",
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine.",
                where="vllm/v1/core/kv_cache_utils.py",
            )
    per_token = kv_bytes_per_token(model.config, args)
    if per_token is None:
        return KvCache(available, None)
    tokens = int(available * GIB // per_token)
    if tokens < max_model_len:
        needed = per_token * max_model_len / GIB
        raise VllmStartupError(
            "ValueError",
            f"To serve at least one request with the models's max seq len ({max_model_len}), ({needed:.2f} GiB KV "
            f"cache is needed, which is larger than the available KV cache memory ({available:.2f} GiB). Based on "
            f"the available memory, the estimated maximum model length is {tokens}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            where="vllm/v1/core/kv_cache_utils.py",
        )
    return KvCache(available, tokens)


def round_gib(n_bytes: int) -> float:
    """Bytes as GiB with vLLM's four decimals."""
    return math.floor(n_bytes / GIB * 10_000) / 10_000
