"""Finding the model vLLM was asked for and checking it the way vLLM's loaders would.

Resolution follows vLLM: an existing directory (on the container disk or a Cloud Storage volume) is a local
model; ``gs://`` is read only by the Run:ai streamer; anything else is a Hugging Face repo id, which means a
download at boot. The sandbox has no internet, and the product must never depend on one (field lesson 11).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.safetensors_format import SafetensorsError, header_length, parse_header
from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.instance import InstanceEnv
from sandbox.vllm.storage import HEAD_BYTES, GcsDir, LocalDir, ModelDir

SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_INDEX = "pytorch_model.bin.index.json"
STREAMER_FORMATS = ("runai_streamer", "runai_streamer_sharded")
SAFETENSORS_ONLY_FORMATS = ("safetensors", "fastsafetensors", *STREAMER_FORMATS)
# vLLM skips these when globbing *.bin / *.pt: they are training state, not weights.
PT_IGNORED = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "model_max_length",
)
DEFAULT_MAX_MODEL_LEN = 2048
_REPO_PART = re.compile(r"^[\w.\-]{1,96}$")
_WHERE_CONFIG = "vllm/transformers_utils/config.py"
_WHERE_LOADER = "vllm/model_executor/model_loader/weight_utils.py"


@dataclass(frozen=True)
class WeightFile:
    """One checkpoint file and its size in bytes."""

    name: str
    size: int


@dataclass(frozen=True)
class ModelInfo:
    """A model that passed vLLM's checks: where it is, its config, and its checked weight files."""

    tag: str
    source: str  # "local", "gcs_mount" or "runai_streamer": decides the load speed
    config: dict[str, Any]
    weight_format: str  # "safetensors", "pt" or "dummy"
    weight_files: tuple[WeightFile, ...]
    num_tensors: int

    @property
    def weight_bytes(self) -> int:
        """Bytes the loader reads."""
        return sum(f.size for f in self.weight_files)


def architecture(config: dict[str, Any]) -> str:
    """The model class vLLM resolves from a config, as its log names it."""
    archs = config.get("architectures") or []
    return str(archs[0]) if archs else str(config.get("model_type", "unknown"))


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under ``text_config``)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def derived_max_model_len(config: dict[str, Any]) -> tuple[int, str]:
    """The context length a config allows, and the key it came from."""
    cfg = text_config(config)
    for key in MAX_LEN_KEYS:
        value = cfg.get(key)
        if isinstance(value, int) and value > 0:
            return value, key
    return DEFAULT_MAX_MODEL_LEN, "default"


def _invalid_repo(tag: str, cause: VllmStartupError) -> VllmStartupError:
    return VllmStartupError(
        "ValueError",
        f"Invalid repository ID or local directory specified: '{tag}'.\n"
        "Please verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
        "   - For Mistral models: ensure the presence of a 'params.json'.",
        where=_WHERE_CONFIG,
        cause=cause,
    )


def is_repo_id(tag: str) -> bool:
    """Whether huggingface_hub accepts ``tag`` as ``name`` or ``namespace/name``."""
    parts = tag.split("/")
    if len(parts) > 2 or "--" in tag or ".." in tag:
        return False
    return all(_REPO_PART.match(p) and p[0] not in "-." and p[-1] not in "-." for p in parts)


def hub_error(tag: str, env: InstanceEnv, note: Callable[[str], None]) -> VllmStartupError:
    """What vLLM raises for a model that is not on the container: it would have to come from the Hub."""
    if not is_repo_id(tag):
        cause = VllmStartupError(
            "huggingface_hub.errors.HFValidationError",
            f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{tag}'. "
            "Use `repo_type` argument if needed.",
            where="huggingface_hub/utils/_validators.py",
        )
        return _invalid_repo(tag, cause)
    if env.env_flag("HF_HUB_OFFLINE").lower() in ("1", "true", "yes", "on"):
        cause = VllmStartupError(
            "huggingface_hub.errors.LocalEntryNotFoundError",
            "Cannot find an appropriate cached snapshot folder for the specified revision on the local disk "
            "and outgoing traffic has been disabled. To enable repo look-ups and downloads online, pass "
            "'local_files_only=False' as input.",
            where="huggingface_hub/_snapshot_download.py",
        )
        return _invalid_repo(tag, cause)
    note(
        f"{tag!r} is neither a directory in the container nor on a Cloud Storage volume, so vLLM would "
        "download it from the Hugging Face Hub at boot. The sandbox has no internet; in the field, boot-time "
        "downloads hit 429 rate limits and blow the startup probe (lesson 11): stage the weights in GCS."
    )
    cause = VllmStartupError(
        "huggingface_hub.errors.LocalEntryNotFoundError",
        "An error happened while trying to locate the file on the Hub and we cannot find the requested files "
        "in the local cache. Please check your connection and try again or make sure your Internet "
        "connection is on.",
        where="huggingface_hub/file_download.py",
    )
    return _invalid_repo(tag, cause)


def locate(tag: str, load_format: str, env: InstanceEnv, note: Callable[[str], None]) -> tuple[ModelDir, str]:
    """The directory ``tag`` names and its source kind; raises the Hub error when it is not a directory."""
    if tag.startswith("gs://"):
        if load_format not in STREAMER_FORMATS:
            note("gs:// model paths are read only with --load-format runai_streamer (lesson 15).")
            raise hub_error(tag, env, note)
        bucket, _, prefix = tag.removeprefix("gs://").partition("/")
        gcs = GcsDir(tag, bucket, prefix, env.storage_emulator)
        if not gcs.exists() or not gcs.files():
            raise VllmStartupError(
                "RuntimeError",
                f"Cannot find any safetensors model weights with `{tag}`",
                where="vllm/model_executor/model_loader/runai_streamer_loader.py",
            )
        return gcs, "runai_streamer"
    path = posixpath.normpath(posixpath.join("/", tag))
    mounts = sorted(env.mounts, key=lambda m: len(m.mount_path), reverse=True)
    for mount in mounts:
        prefix = mount.object_prefix(path)
        if prefix is not None:
            directory: ModelDir = GcsDir(tag, mount.bucket, prefix, env.storage_emulator)
            if directory.exists():
                return directory, "gcs_mount"
            raise hub_error(tag, env, note)
    local = LocalDir(tag, env.root / path.lstrip("/"))
    if local.exists():
        return local, "local"
    raise hub_error(tag, env, note)


def read_config(directory: ModelDir, files: dict[str, int]) -> dict[str, Any]:
    """config.json as transformers reads it, with its errors."""
    if "config.json" not in files:
        cause = VllmStartupError(
            "OSError",
            f"{directory.path} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{directory.path}/tree/None' for available files.",
            where="transformers/utils/hub.py",
        )
        raise _invalid_repo(directory.path, cause)
    try:
        config = json.loads(directory.read("config.json"))
    except ValueError:
        raise VllmStartupError(
            "OSError",
            f"It looks like the config file at '{directory.path.rstrip('/')}/config.json' is not a valid JSON file.",
            where="transformers/configuration_utils.py",
        ) from None
    if not isinstance(config, dict) or not (config.get("model_type") or config.get("architectures")):
        raise VllmStartupError(
            "ValueError",
            f"Unrecognized model in {directory.path}. Should have a `model_type` key in its config.json.",
            where="transformers/models/auto/configuration_auto.py",
        )
    return config


def _safetensor_error(kind: str) -> VllmStartupError:
    return VllmStartupError(
        "safetensors_rust.SafetensorError", f"Error while deserializing header: {kind}", where=_WHERE_LOADER
    )


def _check_safetensors_file(directory: ModelDir, name: str, size: int, note: Callable[[str], None]) -> set[str]:
    """The tensor names of one file whose header is valid and whose size matches what the header announces."""
    where = f"{directory.path.rstrip('/')}/{name}"
    head = directory.read_head(name, size, HEAD_BYTES)
    try:
        length = header_length(head)
        if 8 + length > len(head) and 8 + length <= size:
            head = directory.read_head(name, size, 8 + length)
        parsed = parse_header(head)
    except SafetensorsError as exc:
        note(f"{where}: {exc}")
        if "shorter than" in str(exc):
            raise _safetensor_error("HeaderTooSmall") from None
        if "out of range" in str(exc):
            raise _safetensor_error("HeaderTooLarge") from None
        if "ends inside" in str(exc):
            raise _safetensor_error("MetadataIncompleteBuffer") from None
        raise _safetensor_error("InvalidHeaderDeserialization") from None
    if parsed.file_bytes != size:
        note(f"{where} is {size} bytes but its header announces {parsed.file_bytes} (truncated or padded copy)")
        raise _safetensor_error("MetadataIncompleteBuffer")
    return set(parsed.tensors)


def _read_index(directory: ModelDir, name: str) -> dict[str, str]:
    try:
        index = json.loads(directory.read(name))
    except ValueError as exc:
        raise VllmStartupError("json.decoder.JSONDecodeError", str(exc), where=_WHERE_LOADER) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise VllmStartupError("KeyError", "'weight_map'", where=_WHERE_LOADER)
    return {str(k): str(v) for k, v in weight_map.items()}


def _uninitialized(names: list[str]) -> VllmStartupError:
    shown = ", ".join(repr(n) for n in sorted(names)[:20])
    more = f" (and {len(names) - 20} more)" if len(names) > 20 else ""
    return VllmStartupError(
        "ValueError",
        f"Following weights were not initialized from checkpoint: {{{shown}}}{more}",
        where="vllm/model_executor/model_loader/default_loader.py",
    )


def _safetensors_weights(
    directory: ModelDir, files: dict[str, int], note: Callable[[str], None]
) -> tuple[tuple[WeightFile, ...], int]:
    names = sorted(n for n in files if n.endswith(".safetensors"))
    weight_map: dict[str, str] | None = None
    if SAFETENSORS_INDEX in files:
        weight_map = _read_index(directory, SAFETENSORS_INDEX)
        # vLLM loads only the shards the index names (it drops duplicate consolidated files).
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if n not in files]
        if missing:
            for shard in missing:
                lost = sum(1 for f in weight_map.values() if f == shard)
                note(f"{SAFETENSORS_INDEX} maps {lost} tensors to {shard}, which is not in {directory.path}")
            raise _uninitialized([t for t, f in weight_map.items() if f in missing])
    tensors: dict[str, set[str]] = {n: _check_safetensors_file(directory, n, files[n], note) for n in names}
    if weight_map is not None:
        absent = [t for t, f in weight_map.items() if t not in tensors[f]]
        if absent:
            note(f"{SAFETENSORS_INDEX} names {len(absent)} tensors that are not in the shard it maps them to")
            raise _uninitialized(absent)
    return tuple(WeightFile(n, files[n]) for n in names), sum(len(t) for t in tensors.values())


def _pt_weights(directory: ModelDir, files: dict[str, int], note: Callable[[str], None]) -> tuple[WeightFile, ...]:
    names = sorted(n for n in files if n.endswith((".bin", ".pt")) and n not in PT_IGNORED)
    if PT_INDEX in files:
        wanted = sorted(set(_read_index(directory, PT_INDEX).values()))
        missing = [n for n in wanted if n not in files]
        if missing:
            note(f"{PT_INDEX} names {', '.join(missing)}, missing from {directory.path}")
            raise VllmStartupError(
                "FileNotFoundError",
                f"[Errno 2] No such file or directory: '{directory.path.rstrip('/')}/{missing[0]}'",
                where=_WHERE_LOADER,
            )
        names = wanted
    for name in names:
        if files[name] == 0:
            raise VllmStartupError("EOFError", "Ran out of input", where=_WHERE_LOADER)
    return tuple(WeightFile(n, files[n]) for n in names)


def check_weights(
    directory: ModelDir, files: dict[str, int], load_format: str, tag: str, note: Callable[[str], None]
) -> tuple[str, tuple[WeightFile, ...], int]:
    """The weight format, checked files and tensor count for ``load_format``, or vLLM's loader error."""
    if load_format == "dummy":
        return "dummy", (), 0
    has_safetensors = any(n.endswith(".safetensors") for n in files)
    if load_format in SAFETENSORS_ONLY_FORMATS or (load_format != "pt" and has_safetensors):
        if not has_safetensors:
            kind = "safetensors " if load_format in STREAMER_FORMATS else ""
            raise VllmStartupError(
                "RuntimeError", f"Cannot find any {kind}model weights with `{tag}`", where=_WHERE_LOADER
            )
        weights, count = _safetensors_weights(directory, files, note)
        return "safetensors", weights, count
    weights = _pt_weights(directory, files, note)
    if not weights:
        raise VllmStartupError("RuntimeError", f"Cannot find any model weights with `{tag}`", where=_WHERE_LOADER)
    return "pt", weights, 0


def inspect_model(
    tag: str, load_format: str, env: InstanceEnv, note: Callable[[str], None]
) -> tuple[ModelDir, str, dict[str, Any]]:
    """Locate the model and read its config (before the engine starts, as vLLM does)."""
    directory, source = locate(tag, load_format, env, note)
    files = directory.files()
    return directory, source, read_config(directory, files)


def load_model(
    directory: ModelDir, source: str, config: dict[str, Any], load_format: str, tag: str, note: Callable[[str], None]
) -> ModelInfo:
    """Check the weights as the loader would (headers, sizes, index) and describe the loaded model."""
    files = directory.files()
    weight_format, weights, tensors = check_weights(directory, files, load_format, tag, note)
    return ModelInfo(
        tag=tag,
        source=source,
        config=config,
        weight_format=weight_format,
        weight_files=weights,
        num_tensors=tensors,
    )
