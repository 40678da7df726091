"""Repositories of the Hub stand-in: files, immutable commits, branches, tags and who may read them."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sandbox.hub.blobs import Blob, blob_sha256, git_blob_oid, lfs_pointer

# The user behind SANDBOX_HF_TOKEN: owner of every seeded repo and granted every gated licence.
OWNER_USER = "sandbox-user"
# The user behind SANDBOX_HF_TOKEN_NO_ACCESS: a valid account that accepted no licence.
VISITOR_USER = "sandbox-visitor"

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx")
# The Hub refuses non-LFS files above 10 MB, so anything bigger is an LFS object whatever its name.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
DEFAULT_BRANCH = "main"

GatedMode = Literal[False, "auto", "manual"]


def is_lfs_path(path: str, size: int) -> bool:
    """Whether the Hub stores ``path`` through Git LFS (and the resolve endpoint redirects to the CDN)."""
    return path.lower().endswith(LFS_SUFFIXES) or size > LFS_SIZE_THRESHOLD


@dataclass(frozen=True)
class RepoFile:
    """One file of a commit. ``git_oid`` is the id of what git stores: the content, or the LFS pointer."""

    path: str
    blob: Blob
    git_oid: str
    lfs_sha256: str | None = None
    pointer_size: int | None = None

    @property
    def size(self) -> int:
        return self.blob.size

    @property
    def is_lfs(self) -> bool:
        return self.lfs_sha256 is not None


def make_file(path: str, blob: Blob, sha256: str | None = None) -> RepoFile:
    """Describe ``blob`` stored at ``path``; hashes the content unless ``sha256`` is already known."""
    if is_lfs_path(path, blob.size):
        digest = sha256 or blob_sha256(blob)
        pointer = lfs_pointer(digest, blob.size)
        return RepoFile(path, blob, git_blob_oid(pointer), digest, len(pointer))
    return RepoFile(path, blob, git_blob_oid(blob.read(0, blob.size)))


def make_files(blobs: Mapping[str, Blob]) -> dict[str, RepoFile]:
    """``make_file`` for many files; big LFS objects are hashed in parallel (hashlib releases the GIL)."""
    paths = list(blobs)
    with ThreadPoolExecutor(max_workers=max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        made = pool.map(lambda p: make_file(p, blobs[p]), paths)
        return dict(zip(paths, made, strict=True))


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot. ``changed_in`` maps each path to the commit that last changed it."""

    sha: str
    parent: str | None
    message: str
    author: str
    date: float
    files: Mapping[str, RepoFile]
    changed_in: Mapping[str, str]

    @property
    def title(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


def _commit_sha(repo_id: str, parent: str | None, message: str, files: Mapping[str, RepoFile]) -> str:
    # Deterministic so a seeded sandbox gets the same shas in every run.
    digest = hashlib.sha1(f"commit\n{repo_id}\n{parent}\n{message}\n".encode())
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].git_oid}\n".encode())
    return digest.hexdigest()


@dataclass
class Repo:
    """A model repo: commits by sha, branch and tag names pointing at them, visibility and granted users."""

    repo_id: str
    private: bool = False
    gated: GatedMode = False
    granted: set[str] = field(default_factory=lambda: {OWNER_USER})
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    card_data: dict | None = None
    # How the weights were generated (sandbox.hub.models.ModelSpec as a dict), for regenerated commits.
    generator: dict | None = None
    # A hostile mirror's lies: the size its listings announce for a path (None: the size is left out).
    listed_sizes: dict[str, int | None] = field(default_factory=dict)

    def commit(
        self,
        files: Mapping[str, RepoFile],
        *,
        branch: str = DEFAULT_BRANCH,
        message: str = "Update files",
        author: str = OWNER_USER,
    ) -> Commit:
        """Record ``files`` as the new head of ``branch`` (created from nothing when it does not exist)."""
        parent_sha = self.branches.get(branch)
        parent = self.commits[parent_sha] if parent_sha else None
        frozen = MappingProxyType(dict(sorted(files.items())))
        sha = _commit_sha(self.repo_id, parent_sha, message, frozen)
        changed_in = {
            path: parent.changed_in[path]
            if parent and path in parent.files and parent.files[path].git_oid == item.git_oid
            else sha
            for path, item in frozen.items()
        }
        commit = Commit(sha, parent_sha, message, author, time.time(), frozen, MappingProxyType(changed_in))
        self.commits[sha] = commit
        self.branches[branch] = sha
        return commit

    def resolve(self, revision: str) -> Commit | None:
        """The commit a branch, tag, ``refs/heads/x``, ``refs/tags/x`` or full sha names, if any."""
        if revision.startswith("refs/heads/"):
            sha = self.branches.get(revision.removeprefix("refs/heads/"))
        elif revision.startswith("refs/tags/"):
            sha = self.tags.get(revision.removeprefix("refs/tags/"))
        else:
            sha = self.branches.get(revision) or self.tags.get(revision)
            if sha is None and revision in self.commits:
                sha = revision
        return self.commits.get(sha) if sha else None

    def history(self, sha: str) -> list[Commit]:
        """``sha`` and its ancestors, newest first."""
        out: list[Commit] = []
        current: str | None = sha
        while current is not None:
            commit = self.commits[current]
            out.append(commit)
            current = commit.parent
        return out

    def can_read(self, user: str | None) -> bool:
        """Whether ``user`` (None: anonymous) may see a private repo or download a gated one."""
        return user is not None and user in self.granted
