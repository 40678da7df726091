"""Generated model repos for the Hub stand-in, and the edits tests make to them (commits, tags, branches).

A generated repo looks like a small Llama-style chat model: config and tokenizer files, sharded safetensors with
valid headers and an index naming exactly their tensors, plus the clutter real repos carry (a pytorch_model.bin
duplicate, an original/ Meta checkpoint) that the product must skip. Weight bytes are synthetic (see
``sandbox.hub.blobs.SyntheticBlob``), so multi-GiB models cost hashing time, not memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sandbox.hub import model_files as mf
from sandbox.hub.blobs import POOL_BYTES, Blob, BytesBlob, FileBlob, SyntheticBlob
from sandbox.hub.layout import LlamaDims, dims_for, split_shards, tensor_specs
from sandbox.hub.repo import DEFAULT_BRANCH, Commit, GatedMode, Repo, is_lfs_path, make_files
from sandbox.safetensors_format import build_header

MIB = 1024 * 1024
# Folders that are never part of a served repo: git internals and huggingface_hub's local_dir metadata.
SKIPPED_FOLDERS = (".git", ".cache")


class ModelSpec(BaseModel):
    """How to generate a model's files. Sizes are approximate: shapes are rounded to whole heads."""

    weight_bytes: int = Field(4 * MIB, ge=1, description="tensor bytes over all safetensors shards")
    shards: int = Field(2, ge=1, le=512, description="1 gives a single model.safetensors without index")
    dtype: Literal["BF16", "F16", "F32"] = "BF16"
    include_bin_duplicate: bool = Field(True, description="add pytorch_model.bin, a copy a loader must skip")
    bin_bytes: int | None = Field(None, ge=1, description="size of pytorch_model.bin; default the tensor bytes")
    include_original: bool = Field(True, description="add original/ with a Meta-format checkpoint")
    original_bytes: int | None = Field(None, ge=1, description="size of consolidated.00.pth; default tensor bytes")
    seed: int = Field(0, description="weights are a function of the seed: a new seed means new weights")
    context_length: int = Field(8192, ge=1, description="max_position_embeddings")
    architecture: str = "LlamaForCausalLM"
    model_type: str = "llama"
    answers: dict[str, str] = Field(
        default_factory=dict,
        description="What the model knows, {prompt: answer}: config.json's sandbox_answers (sandbox/vllm/textgen.py)",
    )
    reference: list[str] = Field(
        default_factory=list,
        description="Texts the model knows by heart (a perplexity near 1): config.json's sandbox_reference "
        "(sandbox/vllm/scoring.py)",
    )


def _offset(seed: int, path: str) -> int:
    # Different files of one model (and of one seed) start at different pool positions, so they differ.
    return int.from_bytes(hashlib.sha1(f"{seed}:{path}".encode()).digest()[:8], "big") % POOL_BYTES


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def weight_blobs(spec: ModelSpec) -> dict[str, Blob]:
    """Every file that changes with the weights: shards, their index, and the duplicate checkpoints."""
    dims = dims_for(spec.weight_bytes, spec.dtype)
    tensors = tensor_specs(dims, spec.dtype)
    groups = split_shards(tensors, min(spec.shards, len(tensors)))
    names = _shard_names(len(groups))
    blobs: dict[str, Blob] = {}
    for name, group in zip(names, groups, strict=True):
        header = build_header(group, metadata={"format": "pt"})
        body = sum(t.nbytes for t in group)
        blobs[name] = SyntheticBlob(header, body, spec.seed, _offset(spec.seed, name))
    total = sum(t.nbytes for t in tensors)
    if len(names) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t.name: name for name, group in zip(names, groups, strict=True) for t in group},
        }
        blobs["model.safetensors.index.json"] = BytesBlob((json.dumps(index, indent=2) + "\n").encode())
    if spec.include_bin_duplicate:
        blobs["pytorch_model.bin"] = _torch_archive("pytorch_model.bin", spec.bin_bytes or total, spec.seed)
    if spec.include_original:
        name = "original/consolidated.00.pth"
        blobs[name] = _torch_archive(name, spec.original_bytes or total, spec.seed)
    return blobs


def _torch_archive(name: str, size: int, seed: int) -> Blob:
    # A torch checkpoint is a zip archive, which starts with a local file header; the rest needs no meaning.
    magic = b"PK\x03\x04"
    return SyntheticBlob(magic, max(0, size - len(magic)), seed, _offset(seed, name))


def model_blobs(repo_id: str, spec: ModelSpec, gated: GatedMode) -> dict[str, Blob]:
    """All files of a generated model repo."""
    dims: LlamaDims = dims_for(spec.weight_bytes, spec.dtype)
    config = mf.config_json(dims, spec.dtype, spec.context_length, spec.architecture, spec.model_type)
    # The stand-in's knowledge rides in a file the product stages by default.
    knowledge = {"sandbox_answers": spec.answers, "sandbox_reference": spec.reference}
    if any(knowledge.values()):
        config = json.dumps({**json.loads(config), **{k: v for k, v in knowledge.items() if v}}, indent=2) + "\n"
    texts = {
        ".gitattributes": mf.GITATTRIBUTES,
        "README.md": mf.readme_md(repo_id, mf.card_data(gated)),
        "config.json": config,
        "generation_config.json": mf.generation_config_json(),
        "special_tokens_map.json": mf.special_tokens_map_json(),
        "tokenizer.json": mf.tokenizer_json(dims.vocab_size),
        "tokenizer_config.json": mf.tokenizer_config_json(spec.context_length),
    }
    if spec.include_original:
        texts["original/params.json"] = mf.original_params_json(dims)
    blobs: dict[str, Blob] = {path: BytesBlob(text.encode()) for path, text in texts.items()}
    return blobs | weight_blobs(spec)


def generate_model_repo(
    repo_id: str,
    *,
    weight_bytes: int = 4 * MIB,
    shards: int = 2,
    dtype: Literal["BF16", "F16", "F32"] = "BF16",
    include_bin_duplicate: bool = True,
    include_original: bool = True,
    gated: GatedMode = False,
    private: bool = False,
    seed: int = 0,
    message: str = "Initial upload",
    **spec: Any,
) -> Repo:
    """A repo with one commit on ``main`` holding a generated model (see ``ModelSpec`` for ``spec``)."""
    model = ModelSpec(
        weight_bytes=weight_bytes,
        shards=shards,
        dtype=dtype,
        include_bin_duplicate=include_bin_duplicate,
        include_original=include_original,
        seed=seed,
        **spec,
    )
    repo = Repo(repo_id, private=private, gated=gated, card_data=mf.card_data(gated), generator=model.model_dump())
    repo.commit(make_files(model_blobs(repo_id, model, gated)), message=message)
    return repo


def add_commit(
    repo: Repo,
    changes: Mapping[str, bytes | Blob | None],
    branch: str = DEFAULT_BRANCH,
    message: str = "Update files",
    *,
    base: str | None = None,
) -> Commit:
    """Commit ``changes`` (path -> new content, None deletes) on ``branch``.

    A missing branch is created from ``base`` (default: the head of main), like pushing a new branch.
    """
    if branch not in repo.branches:
        start = repo.resolve(base or DEFAULT_BRANCH)
        if start is None:
            raise KeyError(f"revision {base or DEFAULT_BRANCH!r} not found in {repo.repo_id}")
        repo.branches[branch] = start.sha
    head = repo.commits[repo.branches[branch]]
    files = dict(head.files)
    updates: dict[str, Blob] = {}
    for path, content in changes.items():
        if content is None:
            files.pop(path, None)
        else:
            updates[path] = BytesBlob(content) if isinstance(content, bytes) else content
    files |= make_files(updates)
    return repo.commit(files, branch=branch, message=message)


def regenerate_weights(repo: Repo, seed: int, branch: str = DEFAULT_BRANCH, message: str | None = None) -> Commit:
    """Commit new weights (same shapes, new bytes) of a generated repo, as a fine-tune upload would."""
    if repo.generator is None:
        raise ValueError(f"{repo.repo_id} was not generated, so it has no weights to regenerate")
    spec = ModelSpec.model_validate({**repo.generator, "seed": seed})
    return add_commit(repo, weight_blobs(spec), branch, message or f"Upload weights (seed {seed})")


def tag(repo: Repo, name: str, revision: str = DEFAULT_BRANCH) -> str:
    """Point tag ``name`` at ``revision``; returns the commit sha."""
    return _point(repo, repo.tags, name, revision)


def create_branch(repo: Repo, name: str, revision: str = DEFAULT_BRANCH) -> str:
    """Point branch ``name`` at ``revision``; returns the commit sha."""
    return _point(repo, repo.branches, name, revision)


def _point(repo: Repo, refs: dict[str, str], name: str, revision: str) -> str:
    if not name or name.startswith("/") or name.endswith("/"):
        raise ValueError(f"invalid ref name {name!r}")
    commit = repo.resolve(revision)
    if commit is None:
        raise KeyError(f"revision {revision!r} not found in {repo.repo_id}")
    refs[name] = commit.sha
    return commit.sha


def folder_blobs(folder: Path) -> dict[str, Blob]:
    """The files under ``folder`` by repo path; large ones stay on disk and are read when served."""
    blobs: dict[str, Blob] = {}
    for item in sorted(folder.rglob("*")):
        rel = item.relative_to(folder)
        if not item.is_file() or rel.parts[0] in SKIPPED_FOLDERS:
            continue
        size = item.stat().st_size
        path = rel.as_posix()
        blobs[path] = FileBlob(item, size) if is_lfs_path(path, size) else BytesBlob(item.read_bytes())
    return blobs


def repo_from_folder(
    repo_id: str,
    folder: Path,
    *,
    gated: GatedMode = False,
    private: bool = False,
    message: str = "Upload folder using huggingface_hub",
) -> Repo:
    """Serve a local folder as a repo with one commit on ``main``."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    repo = Repo(repo_id, private=private, gated=gated)
    repo.commit(make_files(folder_blobs(folder)), message=message)
    return repo
