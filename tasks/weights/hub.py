"""The Hugging Face Hub: resolve a revision to a commit and its files, and stream files with resume.

Every Hub call goes through one retry policy (lesson 11): 429 waits as long as the Hub asks (Retry-After in
seconds or as an HTTP date, or the reset of the ``RateLimit`` header), with jitter, a cap per wait and a
budget in total, and each wait is logged; 5xx, 408 and dropped connections back off exponentially; other
4xx fail at once with a message that says what to do. huggingface_hub itself never retries
``model_info``, which is why resolution needs this (FACTS.md). The token is sent to the Hub only; httpx
drops it when the Hub redirects to its CDN.
"""

from __future__ import annotations

import email.utils
import hashlib
import io
import json
import logging
import random
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import google_crc32c
import httpx
import httpx2
import tenacity
from huggingface_hub import hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_ratelimit_headers
from pydantic import BaseModel, Field

from blocks.source import ModelSource
from tasks.common.clients import HubAccess
from tasks.common.logs import run_logger

T = TypeVar("T")


class HubRetryPolicy(BaseModel):
    """How long to keep trying the Hub. Waits on 429 follow the Hub's own hint, capped and budgeted."""

    max_attempts: int = Field(8, ge=1, le=100, description="Attempts per call, the first included.")
    max_wait_s: float = Field(300, gt=0, description="Longest single wait, even if the Hub asks for more.")
    budget_s: float = Field(1800, gt=0, description="Total waiting allowed for one call before giving up.")
    jitter: float = Field(0.1, ge=0, le=1, description="Random extra wait, as a share of each wait.")
    backoff_initial_s: float = Field(1, gt=0, description="First wait after a 5xx or a dropped connection.")
    backoff_max_s: float = Field(30, gt=0, description="Longest wait after a 5xx or a dropped connection.")


class RetryStats:
    """Waits taken by the retry policy during one stage, for the promotion report (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rate_limited = 0
        self.other = 0
        self.waited_s = 0.0

    def record(self, rate_limited: bool, seconds: float) -> None:
        with self._lock:
            if rate_limited:
                self.rate_limited += 1
            else:
                self.other += 1
            self.waited_s += seconds


class HubError(RuntimeError):
    """A Hub failure that retrying cannot fix; the message says what to change."""


class HubAccessDenied(HubError):
    pass


class HubNotFound(HubError):
    pass


class HubRateLimitExhausted(HubError):
    """The Hub kept answering 429 until the retry policy ran out."""


class HubUnreachable(HubError):
    """No connection to the Hub could be opened: a wrong endpoint, or no route to it from where the flow runs."""


class HubUnavailable(HubError):
    """The Hub kept failing (5xx, 408, connections dropped mid-answer) until the retry policy ran out."""


class ChecksumMismatch(HubError):
    pass


class HubListingError(HubError):
    """A name or number in the Hub's file listing that cannot be trusted (a broken or hostile mirror, or a Hub bug)."""


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
_LISTING_FIX = (
    "if hub_endpoint names a mirror, fix the mirror or leave hub_endpoint empty for https://huggingface.co; "
    "otherwise pin revision to a commit without it and tell the repo's owner"
)


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
            f"character), so nothing was downloaded or written. Exclude it with ignore_patterns, or {_LISTING_FIX}"
        )
    return path


def _checked_file(sibling, repo_id: str, commit: str) -> HubFile:
    """A listing entry as a HubFile, its numbers bounded and its digests well-formed (the name is checked on
    selection, so an odd file the user excludes with ignore_patterns does not block the repo)."""
    name = sibling.rfilename
    where = f"the Hub listing of {repo_id}@{commit} gives {name!r}"
    size, blob_id = sibling.size, sibling.blob_id
    lfs = sibling.lfs
    if size is None or blob_id is None:
        raise HubListingError(f"{where} without its size or blob id; {_LISTING_FIX}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise HubListingError(
            f"{where} an implausible size {size!r}: a file must be 0 to {MAX_FILE_BYTES} bytes (the Hub's 50 GB "
            f"per-file limit, MAX_FILE_BYTES); {_LISTING_FIX}"
        )
    if not isinstance(blob_id, str) or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", blob_id):
        raise HubListingError(f"{where} a malformed blob id {blob_id!r}; {_LISTING_FIX}")
    sha256 = None
    if lfs is not None:
        sha256 = lfs.sha256
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise HubListingError(f"{where} as an LFS file without a valid sha256 ({sha256!r}); {_LISTING_FIX}")
        if lfs.size is not None and lfs.size != size:
            raise HubListingError(f"{where} two sizes, {size} and LFS {lfs.size!r}; {_LISTING_FIX}")
    return HubFile(name, size, blob_id, sha256)


@dataclass(frozen=True)
class HubFile:
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
    repo_id: str
    revision: str
    commit: str
    files: tuple[HubFile, ...]
    gated: bool
    private: bool


class TransientHubResponse(Exception):
    """A Hub answer worth retrying (429, 408, 5xx), with the headers that say how long to wait."""

    def __init__(self, status: int, headers: httpx.Headers | dict, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}")
        self.status = status
        self.headers = headers


class IncompleteBody(Exception):
    """The connection ended before the announced number of bytes arrived."""


def _status_and_headers(exc: BaseException) -> tuple[int, dict] | None:
    if isinstance(exc, TransientHubResponse):
        return exc.status, dict(exc.headers)
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code, dict(exc.response.headers)
    return None


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: 429, 408, 5xx, and connections that failed or dropped mid-body."""
    if isinstance(exc, (httpx.TransportError, httpx2.TransportError, IncompleteBody)):
        return True
    found = _status_and_headers(exc)
    return found is not None and (found[0] in (408, 429) or found[0] >= 500)


def retry_after_seconds(headers: dict, now: float | None = None) -> float | None:
    """Seconds the Hub asks us to wait: Retry-After (seconds or HTTP date), else the RateLimit reset."""
    lowered = {k.lower(): v for k, v in headers.items()}
    value = (lowered.get("retry-after") or "").strip()
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                moment = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                moment = None
            if moment is not None:
                return max(moment.timestamp() - (time.time() if now is None else now), 0.0)
    info = parse_ratelimit_headers(headers)
    return float(info.reset_in_seconds) if info is not None else None


class _HubWait(tenacity.wait.wait_base):
    def __init__(self, policy: HubRetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        found = _status_and_headers(exc) if exc else None
        hint = retry_after_seconds(found[1]) if found and found[0] == 429 else None
        if hint is None:
            hint = self.policy.backoff_initial_s * 2 ** (retry_state.attempt_number - 1)
            hint = min(hint, self.policy.backoff_max_s)
        wait = min(hint, self.policy.max_wait_s)
        return wait + wait * self.policy.jitter * random.random()


class _BudgetSpent(tenacity.stop.stop_base):
    def __init__(self, policy: HubRetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return retry_state.idle_for + (retry_state.upcoming_sleep or 0) > self.policy.budget_s


def _describe(exc: BaseException) -> str:
    found = _status_and_headers(exc)
    if found is None:
        return f"connection to the Hub failed ({type(exc).__name__})"
    if found[0] == 429:
        return "rate limited by the Hub"
    return f"the Hub answered HTTP {found[0]}"


def hub_retrying(
    policy: HubRetryPolicy,
    what: str,
    log: logging.Logger | logging.LoggerAdapter,
    stats: RetryStats | None = None,
) -> tenacity.Retrying:
    """A tenacity policy for one Hub call (``what`` names it in the log; ``stats`` counts the waits)."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if stats is not None:
            found = _status_and_headers(exc) if exc else None
            stats.record(bool(found and found[0] == 429), state.upcoming_sleep or 0.0)
        log.warning(
            "%s, waiting %.0f s, attempt %d of %d (%s)",
            _describe(exc) if exc else "Hub call failed",
            state.upcoming_sleep,
            state.attempt_number + 1,
            policy.max_attempts,
            what,
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=_HubWait(policy),
        stop=tenacity.stop_after_attempt(policy.max_attempts) | _BudgetSpent(policy),
        before_sleep=before_sleep,
        reraise=True,
    )


def call_hub(
    fn: Callable[[], T],
    what: str,
    policy: HubRetryPolicy,
    repo_id: str,
    access: HubAccess,
    stats: RetryStats | None = None,
) -> T:
    """Run one Hub call under the retry policy, translating final failures into messages that say what to do."""
    try:
        return hub_retrying(policy, what, run_logger(), stats)(fn)
    except Exception as exc:
        raise translate_hub_error(exc, what, repo_id, access, policy) from None


def _never_connected(exc: BaseException) -> bool:
    """The connection itself failed (refused, no route, DNS, TLS, connect timeout): nothing reached the Hub."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx2.ConnectError, httpx2.ConnectTimeout))


def exhausted_error(exc: BaseException, what: str, repo_id: str, access: HubAccess, policy: HubRetryPolicy) -> HubError:
    """The error for a transient failure that lasted until the retry policy ran out, named by its real cause:
    only a 429 is a rate limit; a Hub that could not be reached at all is named unreachable, with the endpoint
    and where that endpoint came from."""
    gave_up = (
        f"gave up after the retry policy ran out (max_attempts={policy.max_attempts}, budget_s={policy.budget_s:g})"
    )
    where = f"{access.endpoint} (from {access.endpoint_origin})"
    found = _status_and_headers(exc)
    if found is not None and found[0] == 429:
        return HubRateLimitExhausted(
            f"{what}: the Hub at {where} kept rate limiting {repo_id} (HTTP 429); {gave_up}. Anonymous calls from "
            "cloud IPs are rate limited: set a token, or raise HubRetryPolicy.budget_s / max_attempts"
        )
    detail = str(exc).splitlines()[0] if str(exc) else ""
    cause = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    if _never_connected(exc):
        return HubUnreachable(
            f"{what}: the Hub is unreachable: no connection to {where} could be opened ({cause}); {gave_up}. Check "
            "that this is the Hub you mean and that the machine running the flow can reach it (network, proxy, DNS, "
            "firewall), or set the model source's hub_endpoint (or HF_ENDPOINT) to one it can reach"
        )
    failing = f"kept answering HTTP {found[0]}" if found is not None else f"kept dropping the connection ({cause})"
    return HubUnavailable(
        f"{what}: the Hub at {where} {failing} for {repo_id}; {gave_up}. The Hub is failing, not refusing you: run "
        "again later, or raise HubRetryPolicy.budget_s / max_attempts"
    )


def translate_hub_error(
    exc: BaseException, what: str, repo_id: str, access: HubAccess, policy: HubRetryPolicy
) -> BaseException:
    if isinstance(exc, HubError):
        return exc
    endpoint = access.endpoint
    token_hint = (
        "set a token that can read it (ModelSource.token_secret_block names a Prefect Secret block, or HF_TOKEN)"
    )
    if isinstance(exc, GatedRepoError):
        return gated_error(repo_id, endpoint)
    if isinstance(exc, RevisionNotFoundError):
        return HubNotFound(
            f"{what}: revision not found in {repo_id}; use a branch, tag or full 40-character commit sha that "
            f"exists at {endpoint}/{repo_id}"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubNotFound(f"{what}: file not found in {repo_id} at that commit; check allow_patterns")
    if isinstance(exc, RepositoryNotFoundError):
        return HubNotFound(
            f"{what}: repo {repo_id} not found at {endpoint}, or it is private and the request was not allowed "
            f"to see it: check the repo id, and {token_hint}"
        )
    found = _status_and_headers(exc)
    if found is not None and found[0] in (401, 403):
        return HubAccessDenied(
            f"{what}: the Hub refused access to {repo_id} (HTTP {found[0]}): {token_hint}; for gated models accept "
            f"the licence at {endpoint}/{repo_id} with the same account"
        )
    if is_transient(exc):
        return exhausted_error(exc, what, repo_id, access, policy)
    return HubError(f"{what}: {repo_id}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def gated_error(repo_id: str, endpoint: str) -> HubAccessDenied:
    return HubAccessDenied(
        f"{repo_id} is gated: accept its licence at {endpoint}/{repo_id} with your Hugging Face account, then give "
        "the pipeline a token of that account (a Prefect Secret block named in ModelSource.token_secret_block, "
        "or HF_TOKEN). Accepted already? A fine-grained token also needs its permission 'Read access to contents "
        "of all public gated repos you can access' checked (huggingface/huggingface_hub issue 2844)"
    )


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
            f"sha; {_LISTING_FIX}"
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


class Digests:
    """sha256 and crc32c of a byte stream computed on the way, plus the git blob sha1 for files kept in git.

    crc32c is fed the network pieces (google_crc32c takes only read-only bytes, not a view of a reused buffer);
    the hashes are fed whole chunks, so hashlib (which drops the GIL for buffers over 2047 bytes) hashes a chunk
    in one call while the other files' threads download and upload.
    """

    def __init__(self, item: HubFile) -> None:
        self.sha256 = hashlib.sha256()
        self.crc32c = google_crc32c.Checksum()
        # LFS files are verified by sha256 alone; hashing them twice would cost CPU the upload needs.
        self.git_sha1 = None if item.lfs_sha256 else hashlib.sha1(f"blob {item.size}\0".encode(), usedforsecurity=False)

    def update_crc32c(self, piece: bytes) -> None:
        self.crc32c.update(piece)

    def update_hashes(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        if self.git_sha1 is not None:
            self.git_sha1.update(data)

    def matches(self, item: HubFile) -> bool:
        if item.lfs_sha256:
            return self.sha256.hexdigest() == item.lfs_sha256
        assert self.git_sha1 is not None
        return self.git_sha1.hexdigest() == item.git_blob_id


class HubFileStream(io.RawIOBase):
    """A Hub file as a read-only stream that resumes dropped connections and verifies itself.

    ``read(n)`` returns exactly n bytes until the end (upload libraries rely on that); ``readinto(buffer)``
    fills a caller's buffer the same way without allocating (the stager reuses one buffer per file). The digest
    is checked before the last byte is handed out, so an upload fed by this stream never receives the end of a
    corrupt file and never finalizes it.
    """

    def __init__(
        self,
        client: httpx.Client,
        access: HubAccess,
        repo_id: str,
        commit: str,
        item: HubFile,
        policy: HubRetryPolicy,
        stats: RetryStats | None = None,
    ) -> None:
        super().__init__()
        self.stats = stats
        self.client = client
        self.access = access
        self.repo_id = repo_id
        self.item = item
        self.policy = policy
        self.url = hf_hub_url(repo_id, item.path, revision=commit, endpoint=access.endpoint)
        self.digests = Digests(item)
        self.received = 0
        self.position = 0
        self._what = f"downloading {repo_id}/{item.path}"
        # One retry policy per stream, not per network piece: building a tenacity.Retrying and looking up the
        # run logger for every 64 KiB piece cost about 4% of the stager's CPU (py-spy, issue 16).
        self._retrying = hub_retrying(policy, self._what, run_logger(), stats)
        self._leftover = memoryview(b"")
        self._response: httpx.Response | None = None
        self._pieces: Iterator[bytes] | None = None
        self._cdn_url: str | None = None
        self._cdn_refusals = 0  # the CDN's 401/403 on a URL the Hub had just signed (not an expiry)

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        want = self.item.size - self.position if size is None or size < 0 else size
        buffer = bytearray(min(want, self.item.size - self.position))
        count = self.readinto(buffer)
        return bytes(buffer) if count == len(buffer) else bytes(buffer[:count])

    def readinto(self, target: bytearray | memoryview) -> int:
        """Fill ``target`` from the Hub: completely, unless the file ends first; verify before the last byte."""
        view = memoryview(target).cast("B")
        want = min(len(view), self.item.size - self.position)
        filled = 0
        while filled < want:
            if not self._leftover:
                self._leftover = memoryview(self._next_piece())
            take = min(len(self._leftover), want - filled)
            view[filled : filled + take] = self._leftover[:take]  # the one copy: network piece into the buffer
            self._leftover = self._leftover[take:]
            filled += take
        if filled:
            self.digests.update_hashes(view[:filled])
        self.position += filled
        if self.position == self.item.size and filled and not self.digests.matches(self.item):
            raise ChecksumMismatch(
                f"{self.repo_id}/{self.item.path}: content does not match the Hub's "
                f"{'sha256' if self.item.lfs_sha256 else 'git blob id'} {self.item.expected_digest}; nothing was kept"
            )
        return filled

    def _next_piece(self) -> bytes:
        """The next network piece. The common case (an open response) is a plain ``next``; the retry policy is
        entered only to open a connection or after one failed, with the failure as its first attempt."""
        failure: BaseException | None = None
        if self._pieces is not None:
            try:
                piece = next(self._pieces)
            except StopIteration:
                self._drop_connection()
                failure = IncompleteBody(f"{self.item.path}: connection ended at byte {self.received}")
            except httpx.TransportError as exc:
                self._drop_connection()
                failure = exc
            else:
                return self._count(piece)
        pending = [failure]

        def attempt() -> bytes:
            if pending[0] is not None:
                exc, pending[0] = pending[0], None
                raise exc
            return self._pull()

        try:
            piece = self._retrying(attempt)
        except Exception as exc:
            self._drop_connection()
            raise translate_hub_error(exc, self._what, self.repo_id, self.access, self.policy) from None
        return self._count(piece)

    def _count(self, piece: bytes) -> bytes:
        self.received += len(piece)
        if self.received > self.item.size:
            raise ChecksumMismatch(f"{self.item.path}: the Hub sent more than the {self.item.size} bytes it announced")
        self.digests.update_crc32c(piece)
        return piece

    def _pull(self) -> bytes:
        if self._pieces is None:
            self._open()
        assert self._pieces is not None
        try:
            return next(self._pieces)
        except StopIteration:
            self._drop_connection()
            raise IncompleteBody(f"{self.item.path}: connection ended at byte {self.received}") from None
        except httpx.TransportError:
            self._drop_connection()
            raise

    def _open(self) -> None:
        headers = {"Accept-Encoding": "identity"}
        if self.received:
            headers["Range"] = f"bytes={self.received}-"
        if self._cdn_url is None:
            response = self._follow_hub(headers)
        else:
            # Resumes go straight to the CDN URL the Hub signed: no token there, and no extra Hub call.
            response = self.client.send(self.client.build_request("GET", self._cdn_url, headers=headers), stream=True)
            if response.status_code in (401, 403, 404, 410):  # the signed URL expired: ask the Hub again
                response.close()
                self._cdn_url = None
                raise IncompleteBody(f"{self.item.path}: CDN URL expired at byte {self.received}")
        if response.status_code in (401, 403) and self._cdn_url is not None:
            self._refused_by_cdn(response)
        if response.status_code in (200, 206):
            pieces: Iterator[bytes] = response.iter_raw()
            if response.status_code == 200 and self.received:
                pieces = _skip(pieces, self.received)
            self._response, self._pieces = response, pieces
            return
        response.read()
        response.close()
        if response.status_code in (408, 429) or response.status_code >= 500:
            raise TransientHubResponse(response.status_code, response.headers, str(response.url))
        raise _http_error(response, self.repo_id, self.item.path, self.access.endpoint)

    def _refused_by_cdn(self, response: httpx.Response) -> None:
        """The CDN refused a URL the Hub signed moments ago: the Hub granted access, so the token is not the cause.
        huggingface/xet-core issue 897: us.gcp.cdn.hf.co answered GCP egress 403 "SignatureError: invalid key pair
        id" for its own signed URLs. Once, the URL is asked of the Hub again (a fresh signature, maybe another CDN
        host); twice, the error names the host that refused."""
        body = response.read()[:300].decode(errors="replace")
        response.close()
        host = httpx.URL(self._cdn_url or "").host
        self._cdn_url = None
        self._cdn_refusals += 1
        if self._cdn_refusals == 1:
            raise IncompleteBody(f"{self.item.path}: the CDN host {host} refused its signed URL; resolving again")
        code = next((c for c in ("SignatureError", "AccessDenied", "SignatureDoesNotMatch") if c in body), "")
        status = f"HTTP {response.status_code} {code}".rstrip()
        raise HubAccessDenied(
            f"downloading {self.repo_id}/{self.item.path}: the Hub granted access and redirected to its CDN, but the "
            f"CDN host {host} refused the URL the Hub had signed ({status}), twice. The token is not the cause: "
            "this is the CDN's refusal, known for Google Cloud egress (huggingface/xet-core issue 897); run again "
            "later, or stage from another network"
        )

    def _follow_hub(self, headers: dict[str, str]) -> httpx.Response:
        """GET the resolve URL with the token; remember the CDN URL an LFS file redirects to."""
        url = self.url
        hub_origin = httpx.URL(self.url).netloc
        for _ in range(5):
            sent = dict(headers)
            on_hub = httpx.URL(url).netloc == hub_origin
            if on_hub and self.access.token is not None:
                sent["Authorization"] = f"Bearer {self.access.token.get_secret_value()}"
            response = self.client.send(self.client.build_request("GET", url, headers=sent), stream=True)
            if not response.is_redirect:
                return response
            response.close()
            url = str(response.url.join(response.headers["location"]))
            if httpx.URL(url).netloc != hub_origin:
                self._cdn_url = url
        raise HubError(f"downloading {self.repo_id}/{self.item.path}: too many redirects")

    def _drop_connection(self) -> None:
        if self._response is not None:
            self._response.close()
        self._response, self._pieces = None, None

    def close(self) -> None:
        self._drop_connection()
        super().close()


def _skip(pieces: Iterator[bytes], count: int) -> Iterator[bytes]:
    """Drop the first ``count`` bytes (a server that ignored our Range header sent them again)."""
    for piece in pieces:
        if count >= len(piece):
            count -= len(piece)
            continue
        yield piece[count:]
        count = 0


def _http_error(response: httpx.Response, repo_id: str, path: str, endpoint: str) -> HubError:
    code = response.headers.get("x-error-code", "")
    if code == "GatedRepo":
        return gated_error(repo_id, endpoint)
    if response.status_code in (401, 403):
        return HubAccessDenied(
            f"downloading {repo_id}/{path}: the Hub refused access (HTTP {response.status_code}); set a token that "
            "can read the repo (ModelSource.token_secret_block or HF_TOKEN)"
        )
    if response.status_code == 404:
        return HubNotFound(f"downloading {repo_id}/{path}: not found at the resolved commit ({code or 'HTTP 404'})")
    return HubError(f"downloading {repo_id}/{path}: HTTP {response.status_code} {code}".rstrip())


def read_json_file(
    http: httpx.Client,
    access: HubAccess,
    repo_id: str,
    commit: str,
    item: HubFile,
    policy: HubRetryPolicy,
    stats: RetryStats | None = None,
) -> dict:
    """A small JSON object file of the repo (config.json, an index), its size bounded before it is read whole."""
    if item.size > MAX_JSON_BYTES:
        raise HubListingError(
            f"the Hub listing of {repo_id}@{commit} gives {item.path!r} {item.size} bytes, above the {MAX_JSON_BYTES} "
            f"a model's JSON file plausibly has (MAX_JSON_BYTES), so it was not read; {_LISTING_FIX}"
        )
    data = HubFileStream(http, access, repo_id, commit, item, policy, stats).read()
    try:
        value = json.loads(data)
    except ValueError as exc:
        value = exc
    if not isinstance(value, dict):
        what = f"is not valid JSON ({value})" if isinstance(value, Exception) else "is not a JSON object"
        raise HubListingError(
            f"{item.path} of {repo_id}@{commit} {what}; pin revision to a commit where it is valid, or fix the repo"
        )
    return value
