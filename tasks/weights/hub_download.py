"""Stream a Hub file at a resolved commit: resume dropped connections, verify the bytes on the way.

The token is sent to the Hub only; the CDN URL an LFS file redirects to is signed and gets none. Dropped
connections resume with a Range request under the Hub retry policy (tasks/weights/hub_retry.py).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator

import google_crc32c
import httpx
from huggingface_hub import hf_hub_url

from tasks.common.clients import HubAccess
from tasks.common.logs import run_logger
from tasks.weights.hub_errors import (
    LISTING_FIX,
    ChecksumMismatch,
    HubAccessDenied,
    HubError,
    HubListingError,
    HubNotFound,
    gated_error,
)
from tasks.weights.hub_listing import MAX_JSON_BYTES, HubFile
from tasks.weights.hub_retry import (
    HubRetryPolicy,
    IncompleteBody,
    RetryStats,
    TransientHubResponse,
    hub_retrying,
    translate_hub_error,
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
            f"a model's JSON file plausibly has (MAX_JSON_BYTES), so it was not read; {LISTING_FIX}"
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
