"""JSON shapes of the Hub API (model info, tree entries, refs, commits), as huggingface_hub 2.4.0 parses them."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime

from sandbox.hub.repo import Commit, Repo, RepoFile
from sandbox.safetensors_format import SafetensorsError, header_length, parse_header

SAFE_SCAN = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None}, "pickleImportScan": None}


def iso(ts: float) -> str:
    """The Hub's timestamp format, e.g. ``2024-05-01T12:00:00.000Z``."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _last_commit(repo: Repo, sha: str) -> dict:
    commit = repo.commits[sha]
    return {"id": commit.sha, "title": commit.title, "date": iso(commit.date)}


def file_entry(repo: Repo, commit: Commit, item: RepoFile, expand: bool) -> dict:
    size = repo.listed_sizes.get(item.path, item.size)  # what a hostile mirror claims, else the truth
    entry: dict = {"type": "file", "oid": item.git_oid, "size": size, "path": item.path}
    if item.is_lfs:
        entry["lfs"] = {"oid": item.lfs_sha256, "size": size, "pointerSize": item.pointer_size}
    if expand:
        entry["lastCommit"] = _last_commit(repo, commit.changed_in[item.path])
        entry["securityFileStatus"] = SAFE_SCAN
    return entry


def _files_under(commit: Commit, folder: str) -> list[RepoFile]:
    prefix = folder + "/"
    return [item for path, item in commit.files.items() if path.startswith(prefix)]


def folder_entry(repo: Repo, commit: Commit, folder: str, expand: bool) -> dict:
    inside = _files_under(commit, folder)
    digest = hashlib.sha1(b"tree\0")
    for item in inside:
        digest.update(f"{item.path}\0{item.git_oid}\n".encode())
    entry: dict = {"type": "directory", "oid": digest.hexdigest(), "size": 0, "path": folder}
    if expand:
        newest = max((commit.changed_in[i.path] for i in inside), key=lambda sha: repo.commits[sha].date)
        entry["lastCommit"] = _last_commit(repo, newest)
    return entry


def folders(commit: Commit) -> set[str]:
    """Every folder that holds a file of ``commit``."""
    out: set[str] = set()
    for path in commit.files:
        parts = path.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def tree(repo: Repo, commit: Commit, folder: str, *, recursive: bool, expand: bool) -> list[dict] | None:
    """Entries under ``folder`` ("" is the root), or None when no such folder exists."""
    all_folders = folders(commit)
    if folder and folder not in all_folders:
        return None
    prefix = f"{folder}/" if folder else ""

    def wanted(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    entries = [folder_entry(repo, commit, f, expand) for f in all_folders if wanted(f)]
    entries += [file_entry(repo, commit, item, expand) for path, item in commit.files.items() if wanted(path)]
    return sorted(entries, key=lambda e: e["path"])


def paths_info(repo: Repo, commit: Commit, paths: Iterable[str], expand: bool) -> list[dict]:
    """Entries for the requested paths that exist (missing ones are left out, as the Hub does)."""
    all_folders = folders(commit)
    out = []
    for path in paths:
        path = path.strip("/")
        if path in commit.files:
            out.append(file_entry(repo, commit, commit.files[path], expand))
        elif path in all_folders:
            out.append(folder_entry(repo, commit, path, expand))
    return out


def _read_json(item: RepoFile | None) -> dict:
    if item is None or item.is_lfs or item.size > 1024 * 1024:
        return {}
    try:
        data = json.loads(item.blob.read(0, item.size))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def safetensors_summary(commit: Commit) -> dict | None:
    """Parameter counts by dtype over every safetensors file, read from their headers."""
    params: dict[str, int] = {}
    for path, item in commit.files.items():
        if not path.endswith(".safetensors"):
            continue
        try:
            length = header_length(item.blob.read(0, 8))
            header = parse_header(item.blob.read(0, 8 + length))
        except SafetensorsError:
            continue
        for info in header.tensors.values():
            params[info["dtype"]] = params.get(info["dtype"], 0) + math.prod(info["shape"])
    return {"parameters": params, "total": sum(params.values())} if params else None


def _used_storage(repo: Repo) -> int:
    seen: dict[str, int] = {}
    for commit in repo.commits.values():
        for item in commit.files.values():
            seen[item.lfs_sha256 or item.git_oid] = item.size
    return sum(seen.values())


def model_info(repo: Repo, commit: Commit, *, blobs: bool) -> dict:
    """``GET /api/models/{repo_id}[/revision/{rev}]``."""
    config = _read_json(commit.files.get("config.json"))
    tokenizer = _read_json(commit.files.get("tokenizer_config.json"))
    summary = {key: config[key] for key in ("architectures", "model_type") if key in config}
    if tokenizer:
        keys = ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template")
        summary["tokenizer_config"] = {key: tokenizer[key] for key in keys if key in tokenizer}
    siblings = []
    for path, item in commit.files.items():
        sibling: dict = {"rfilename": path}
        if blobs:
            size = repo.listed_sizes.get(path, item.size)  # what a hostile mirror claims, else the truth
            sibling |= {"size": size, "blobId": item.git_oid}
            if item.is_lfs:
                sibling["lfs"] = {"sha256": item.lfs_sha256, "size": size, "pointerSize": item.pointer_size}
            if size is None:
                sibling.pop("size")
        siblings.append(sibling)
    card = repo.card_data or {}
    tags = ["transformers", *(["safetensors"] if any(p.endswith(".safetensors") for p in commit.files) else [])]
    tags += [t for t in (config.get("model_type"), card.get("pipeline_tag")) if t]
    tags += (["conversational"] if "chat_template" in tokenizer else []) + list(card.get("tags", []))
    tags += [f"license:{card['license']}"] if "license" in card else []
    info: dict = {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": commit.sha,
        "lastModified": iso(commit.date),
        "createdAt": iso(repo.created_at),
        "private": repo.private,
        "disabled": False,
        "gated": repo.gated,
        "downloads": 0,
        "likes": 0,
        "library_name": card.get("library_name", "transformers"),
        "pipeline_tag": card.get("pipeline_tag", "text-generation"),
        "tags": [*tags, "region:us"],
        "config": summary,
        "cardData": card or None,
        "siblings": siblings,
        "spaces": [],
        "usedStorage": _used_storage(repo),
    }
    if (tensors := safetensors_summary(commit)) is not None:
        info["safetensors"] = tensors
    return info


def refs(repo: Repo, include_prs: bool) -> dict:
    """``GET /api/models/{repo_id}/refs``; branches named ``refs/pr/N`` are pull requests."""

    def ref(name: str, sha: str, kind: str) -> dict:
        full = name if name.startswith("refs/") else f"refs/{kind}/{name}"
        return {"name": name, "ref": full, "targetCommit": sha}

    branches = {n: s for n, s in repo.branches.items() if not n.startswith("refs/pr/")}
    out: dict = {
        "branches": [ref(n, s, "heads") for n, s in sorted(branches.items())],
        "converts": [],
        "tags": [ref(n, s, "tags") for n, s in sorted(repo.tags.items())],
    }
    if include_prs:
        out["pullRequests"] = [ref(n, s, "pr") for n, s in sorted(repo.branches.items()) if n not in branches]
    return out


def commits(repo: Repo, commit: Commit) -> list[dict]:
    """``GET /api/models/{repo_id}/commits/{rev}``, newest first."""
    return [
        {
            "id": c.sha,
            "title": c.title,
            "message": c.message,
            "authors": [{"user": c.author, "avatar": None}],
            "date": iso(c.date),
        }
        for c in repo.history(commit.sha)
    ]
