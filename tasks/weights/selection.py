"""Which files of a repo to stage: what vLLM needs to load the model, without duplicate weight formats.

Pure functions over the Hub's file list. Default: safetensors weights (only the shards of the index when
there is one), the index, config and generation config, tokenizer and chat-template files, processor
configs, at the repo root. ``*.bin``, ``*.pth``, ``*.pt``, ``*.gguf``, ``original/`` and other duplicates are
skipped when safetensors exist (pytorch ``*.bin`` weights are taken only when there is nothing else).
``allow_patterns`` replaces the default; ``ignore_patterns`` removes files from either.

Every selection is checked before anything is downloaded: each name must be a plain relative path (the listing
is untrusted), the files must add up to a plausible size, and the folder must hold weights vLLM can load.
vLLM's default loader (``DefaultModelLoader._prepare_weights`` in vllm/model_executor/model_loader/
default_loader.py) globs ``*.safetensors``, else ``*.bin``, in the model folder itself (not its subfolders),
and stops with "Cannot find any model weights" when there are none; a ``.gguf`` loads only when the model is
that one file, never from a folder.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch

from tasks.weights.hub_listing import MAX_MODEL_BYTES, MAX_SELECTED_FILES, HubFile, check_path

SUPPORT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "*.tiktoken",
    "chat_template.json",
    "chat_template.jinja",
    "*.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "params.json",
)
SAFETENSORS_INDEX = "*.safetensors.index.json"
BIN_WEIGHTS = ("pytorch_model*.bin", "pytorch_model.bin.index.json")
# What vLLM's loader reads from the folder root, minus the training leftovers it filters out itself
# (weight_utils.filter_files_not_needed_for_inference).
VLLM_INDEX = "model.safetensors.index.json"  # the one index vLLM reads (transformers' SAFE_WEIGHTS_INDEX_NAME)
SERVABLE_WEIGHTS = ("*.safetensors", "*.bin")
NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
_SHARD = re.compile(r"(?P<stem>.+)-(?P<index>\d+)-of-(?P<count>\d+)\.(?P<ext>safetensors|bin)")


class SelectionError(ValueError):
    """The selection cannot produce a loadable model; raised before anything is uploaded."""


def _matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch(path, pattern) for pattern in patterns)


def _default(files: list[HubFile]) -> list[HubFile]:
    root = [f for f in files if "/" not in f.path]
    safetensors = [f for f in root if f.path.endswith(".safetensors")]
    indexes = [f for f in root if fnmatch(f.path, SAFETENSORS_INDEX)]
    if indexes:
        # Repos such as Mistral's also ship consolidated*.safetensors beside the index's shards.
        weights = [f for f in safetensors if not f.path.startswith("consolidated")]
    elif safetensors:
        weights = safetensors
    else:
        weights = [f for f in root if _matches(f.path, BIN_WEIGHTS)]
    support = [f for f in root if _matches(f.path, SUPPORT_FILES)]
    return [*weights, *indexes, *support]


def select_files(
    files: tuple[HubFile, ...] | list[HubFile],
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    repo_id: str = "the repo",
    commit: str = "",
) -> list[HubFile]:
    """The files to stage, sorted by path; raises SelectionError when the result could not be served."""
    chosen = [f for f in files if _matches(f.path, allow_patterns)] if allow_patterns else _default(list(files))
    if ignore_patterns:
        chosen = [f for f in chosen if not _matches(f.path, ignore_patterns)]
    chosen = sorted({f.path: f for f in chosen}.values(), key=lambda f: f.path)
    if not chosen:
        listed = ", ".join(f.path for f in files[:12]) + (" ..." if len(files) > 12 else "")
        raise SelectionError(
            f"no files of {repo_id} match the selection (allow_patterns={allow_patterns}, ignore_patterns="
            f"{ignore_patterns}); the repo has: {listed or 'no files'}. Adjust allow_patterns or ignore_patterns"
        )
    for item in chosen:  # before anything else reads the names: they become object names and manifest entries
        check_path(item.path, repo_id, commit)
    _check_size(chosen, repo_id)
    _check_servable(list(files), chosen, allow_patterns, ignore_patterns, repo_id)
    weights = [f for f in chosen if f.path.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf"))]
    if weights and not any(f.path == "config.json" or f.path.endswith("/config.json") for f in chosen):
        ignored = bool(ignore_patterns) and _matches("config.json", ignore_patterns or [])
        fix = (
            "remove the pattern that matches config.json from ignore_patterns"
            if ignored
            else "add 'config.json' to allow_patterns"
        )
        raise SelectionError(
            f"the selection of {repo_id} has weights but no config.json, which vLLM needs to load them; {fix}"
        )
    return chosen


def _check_size(chosen: list[HubFile], repo_id: str) -> None:
    total = sum(f.size for f in chosen)
    if len(chosen) > MAX_SELECTED_FILES:
        raise SelectionError(
            f"the selection of {repo_id} has {len(chosen)} files, more than the {MAX_SELECTED_FILES} a model folder "
            "plausibly holds (MAX_SELECTED_FILES); narrow allow_patterns or add ignore_patterns"
        )
    if total > MAX_MODEL_BYTES:
        raise SelectionError(
            f"the selection of {repo_id} adds up to {total / 1e12:.1f} TB, above the {MAX_MODEL_BYTES / 1e12:.0f} TB "
            "no served model reaches (MAX_MODEL_BYTES): the listing is implausible, or the selection takes "
            "duplicate formats; narrow allow_patterns or add ignore_patterns"
        )


def _check_servable(
    files: list[HubFile],
    chosen: list[HubFile],
    allow_patterns: list[str] | None,
    ignore_patterns: list[str] | None,
    repo_id: str,
) -> None:
    """The staged folder must hold weights vLLM loads, every shard of a numbered set included."""
    weights = [
        f
        for f in chosen
        if "/" not in f.path and _matches(f.path, SERVABLE_WEIGHTS) and not _matches(f.path, NOT_WEIGHTS)
    ]
    if not weights:
        others = sorted({f.path for f in files if f.path.endswith((".gguf", ".pt", ".pth", ".safetensors", ".bin"))})
        seen = ", ".join(others[:6]) + (" ..." if len(others) > 6 else "")
        raise SelectionError(
            f"the selection of {repo_id} (allow_patterns={allow_patterns}, ignore_patterns={ignore_patterns}) has no "
            "*.safetensors or *.bin weights at the repo root, so vLLM would find no weights in the staged folder; "
            + (f"the repo has {seen} (GGUF and .pt/.pth files, and weights in subfolders, cannot be served from the "
               "folder); " if seen else "the repo has no weights at all; ")
            + "choose a repo with safetensors weights, or widen allow_patterns / trim ignore_patterns to select them"
        )  # fmt: skip
    present = {f.path for f in chosen}
    for item in weights:
        shard = _SHARD.fullmatch(item.path)
        if shard is None:
            continue
        count, width = int(shard["count"]), len(shard["index"])
        names = [f"{shard['stem']}-{i:0{width}d}-of-{shard['count']}.{shard['ext']}" for i in range(1, count + 1)]
        missing = [name for name in names if name not in present]
        if missing and count <= MAX_SELECTED_FILES:
            listed = {f.path for f in files}
            where = "left out by the selection" if all(name in listed for name in missing) else "absent from the repo"
            raise SelectionError(
                f"the selection of {repo_id} has {item.path} but not {', '.join(missing[:4])}"
                f"{' ...' if len(missing) > 4 else ''} ({len(missing)} of {count} shards {where}): vLLM would load "
                "a partial model. Select every shard (widen allow_patterns / trim ignore_patterns), or pin a "
                "revision where the set is complete"
            )


def index_to_check(chosen: list[HubFile]) -> HubFile | None:
    """The safetensors index vLLM will read from the staged folder, when the selection has it."""
    return next((f for f in chosen if f.path == VLLM_INDEX), None)


def check_index(index: dict, chosen: list[HubFile], files: list[HubFile] | tuple[HubFile, ...], repo_id: str) -> None:
    """Every shard the index's weight_map names must be selected: vLLM loads only the shards the index names
    (weight_utils.filter_duplicate_safetensors_files), so one missing shard leaves weights unloaded."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise SelectionError(
            f"{VLLM_INDEX} of {repo_id} has no weight_map of tensor -> shard file names, which vLLM needs to pick "
            f"the shards; pin a revision with a valid index, or leave it out with ignore_patterns=['{VLLM_INDEX}']"
        )
    present = {f.path for f in chosen}
    listed = {f.path for f in files}
    named = sorted(set(weight_map.values()))
    missing = [name for name in named if name not in present]
    if missing:
        absent = [name for name in missing if name not in listed]
        shown = ", ".join(repr(name) for name in missing[:4]) + (" ..." if len(missing) > 4 else "")
        where = "absent from the repo's listing" if absent else "left out by the selection"
        raise SelectionError(
            f"{VLLM_INDEX} of {repo_id} names {len(named)} shards, {len(missing)} of them {where}: {shown}. vLLM "
            "would load a partial model. Select every shard the index names (widen allow_patterns / trim "
            "ignore_patterns), or pin a revision where the index and the shards agree"
        )
