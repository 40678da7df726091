"""Which files of a repo to stage: what vLLM needs to load the model, without duplicate weight formats.

Pure functions over the Hub's file list. Default: safetensors weights (only the shards of the index when
there is one), the index, config and generation config, tokenizer and chat-template files, processor
configs, at the repo root. ``*.bin``, ``*.pth``, ``*.pt``, ``*.gguf``, ``original/`` and other duplicates are
skipped when safetensors exist (pytorch ``*.bin`` weights are taken only when there is nothing else).
``allow_patterns`` replaces the default; ``ignore_patterns`` removes files from either.
"""

from __future__ import annotations

from fnmatch import fnmatch

from tasks.hub import HubFile

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
