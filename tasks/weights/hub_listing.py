"""Resolve a revision of a Hub repo to its commit and files, and refuse listings that cannot be trusted.

A listing's names become object names and its numbers size memory, probes and costs, so both are bounded here
before anything is downloaded: a mirror (hub_endpoint) can list anything the real Hub never would.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from blocks.source import ModelSource
from tasks.common.clients import HubAccess
from tasks.weights.hub_errors import LISTING_FIX, HubListingError, gated_error
from tasks.weights.hub_retry import HubRetryPolicy, RetryStats, call_hub

# Bounds on numbers from the listing, before they size memory, probes and costs. The Hub refuses files over 50 GB
# (hub-docs, "Per file: 50GB max"); 2 TB of selected weights is above any open model published so far (the
# largest, ~1T parameters in bf16, is about 2 TB) and above what any Cloud Run GPU instance could load.
MAX_FILE_BYTES = 50 * 1024**3
MAX_MODEL_BYTES = 2 * 1000**4
MAX_SELECTED_FILES = 10_000  # the Hub recommends under 10k entries per folder; vLLM reads one folder
MAX_JSON_BYTES = 16 * 1024**2  # config.json and indexes are read whole into memory: a few MiB at most in practice
MAX_PATH_BYTES = 512  # GCS object names are at most 1024 bytes; the prefix, repo id and commit need the rest
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def unsafe_path_reason(path: object) -> str | None:
    """Why ``path`` is not a plain relative POSIX path (the only kind that may become an object name), or None.

    The real Hub never lists such names: huggingface_hub refuses '..' segments on upload
    (``_commit_api._validate_path_in_repo``), git refuses empty segments. A mirror can list anything.
    """
    if not isinstance(path, str) or not path:
        return "is empty"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in path):
        return "holds a control character"
    if "\\" in path:
        return "holds a backslash"
    if path.startswith("/"):
        return "is absolute"
    segments = path.split("/")
    if "" in segments:
        return "has an empty segment ('//' or a trailing '/')"
    if ".." in segments:
        return "has a '..' segment"
    if "." in segments:
        return "has a '.' segment"
    if size > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    return None


def check_path(path: str, repo_id: str, commit: str) -> str:
    """``path`` when it is a plain relative path; else a HubListingError naming it (repr shows control chars)."""
    reason = unsafe_path_reason(path)
    if reason is not None:
        raise HubListingError(
            f"the Hub listing of {repo_id}@{commit or '?'} names a file {path!r} that {reason}; a file name must be "
            "a plain relative path (no leading '/', no '.', '..' or empty segments, no backslash or control "
            f"character), so nothing was downloaded or written. Exclude it with ignore_patterns, or {LISTING_FIX}"
        )
    return path


@dataclass(frozen=True)
class HubFile:
    """One file of the listing at the resolved commit: its path, size and the digest that verifies it."""

    path: str
    size: int
    git_blob_id: str
    lfs_sha256: str | None

    @property
    def expected_digest(self) -> str:
        """What verifies this file: the LFS sha256, or the git blob id for files stored in git."""
        return self.lfs_sha256 or self.git_blob_id


@dataclass(frozen=True)
class ResolvedModel:
    """A revision pinned to its commit, with the listing of its files (sorted by path)."""

    repo_id: str
    revision: str
    commit: str
    files: tuple[HubFile, ...]
    gated: bool
    private: bool


def _checked_file(sibling, repo_id: str, commit: str) -> HubFile:
    """A listing entry as a HubFile, its numbers bounded and its digests well-formed (the name is checked on
    selection, so an odd file the user excludes with ignore_patterns does not block the repo)."""
    name = sibling.rfilename
    where = f"the Hub listing of {repo_id}@{commit} gives {name!r}"
    size, blob_id = sibling.size, sibling.blob_id
    lfs = sibling.lfs
    if size is None or blob_id is None:
        raise HubListingError(f"{where} without its size or blob id; {LISTING_FIX}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise HubListingError(
            f"{where} an implausible size {size!r}: a file must be 0 to {MAX_FILE_BYTES} bytes (the Hub's 50 GB "
            f"per-file limit, MAX_FILE_BYTES); {LISTING_FIX}"
        )
    if not isinstance(blob_id, str) or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", blob_id):
        raise HubListingError(f"{where} a malformed blob id {blob_id!r}; {LISTING_FIX}")
    sha256 = None
    if lfs is not None:
        sha256 = lfs.sha256
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise HubListingError(f"{where} as an LFS file without a valid sha256 ({sha256!r}); {LISTING_FIX}")
        if lfs.size is not None and lfs.size != size:
            raise HubListingError(f"{where} two sizes, {size} and LFS {lfs.size!r}; {LISTING_FIX}")
    return HubFile(name, size, blob_id, sha256)


def resolve_model(
    access: HubAccess, source: ModelSource, policy: HubRetryPolicy, stats: RetryStats | None = None
) -> ResolvedModel:
    """The commit ``source.revision`` points at, with every file's size, git blob id and LFS sha256."""
    api = access.api()
    info = call_hub(
        lambda: api.model_info(source.repo_id, revision=source.revision, files_metadata=True),
        f"resolving {source.repo_id}@{source.revision}",
        policy,
        source.repo_id,
        access,
        stats,
    )
    commit = info.sha or ""
    if not _COMMIT_SHA.fullmatch(commit):
        # The commit becomes a folder of every object name: only a full lowercase sha may.
        raise HubListingError(
            f"the Hub answered {commit!r} as the commit of {source.repo_id}@{source.revision}, not a 40-character "
            f"sha; {LISTING_FIX}"
        )
    files = [_checked_file(sibling, source.repo_id, commit) for sibling in info.siblings or []]
    gated = bool(info.gated)
    if gated and access.token is None:
        raise gated_error(source.repo_id, access.endpoint)
    return ResolvedModel(
        repo_id=source.repo_id,
        revision=source.revision,
        commit=commit,
        files=tuple(sorted(files, key=lambda f: f.path)),
        gated=gated,
        private=bool(info.private),
    )
