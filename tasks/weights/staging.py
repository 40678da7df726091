"""Stage a model's weights from the Hub into GCS: streamed, verified, resumable, idempotent.

Layout: ``gs://{bucket}/{prefix}/{repo_id}/{commit}/{path}``; every object carries its sha256, git blob id
and source in metadata. Each file streams from the Hub straight into a GCS upload (no local copy, memory
bounded by chunk size times parallel files) while its sha256 / git blob id and crc32c are computed; a file
whose content does not match the Hub's digest never finalizes its upload, and an object whose crc32c does
not match ours is deleted. ``_manifest.json`` is written last, only when every file is verified: its
presence means complete. A rerun skips verified objects; a complete manifest makes the stage a no-op in one
Hub call and one GCS read (lessons 11, 15, 18).
"""

from __future__ import annotations

import base64
import contextvars
import datetime as dt
import json
import queue
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import httpx
from google.api_core import exceptions as gexc
from google.cloud import storage as gcs
from prefect import task
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field, SecretStr, field_validator

from blocks.source import ModelSource
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.logs import run_logger
from tasks.common.progress import ByteProgress, artifact_key
from tasks.weights.hub_download import HubFileStream, read_json_file
from tasks.weights.hub_errors import ChecksumMismatch
from tasks.weights.hub_listing import HubFile, ResolvedModel, resolve_model, unsafe_path_reason
from tasks.weights.hub_retry import HubRetryPolicy, RetryStats
from tasks.weights.selection import check_index, index_to_check, select_files

MANIFEST = "_manifest.json"
SIMPLE_UPLOAD_LIMIT = 8 * 1024 * 1024  # google-cloud-storage's multipart/resumable threshold


class StagingError(RuntimeError):
    """Staging cannot proceed; the message names the bucket or file and the fix."""


class StagingOptions(BaseModel):
    """Knobs of the stager; memory grows with parallel_files x chunk_mib, never with the model's size."""

    # Defaults from `python -m bench.staging` (issue 16, docs/reference.md "Staging weights"): 16 MiB chunks cost
    # less CPU per GiB than 8 MiB (half the upload requests) and keep peak RSS near 200 MiB; 32 MiB saved no more CPU
    # and took RSS to 266 MiB. 4 files beat 2 by about 45% at 4 GiB (212 vs 145 MB/s median).
    parallel_files: int = Field(4, ge=1, le=32, description="Files streamed at once.")
    chunk_mib: int = Field(16, ge=1, le=256, description="GCS resumable upload chunk, MiB (memory per file).")
    retry: HubRetryPolicy = Field(default_factory=HubRetryPolicy, description="Hub retry and 429 policy.")


class StagedFile(BaseModel):
    path: str
    size: int
    sha256: str
    git_blob_id: str

    @field_validator("path")
    @classmethod
    def _plain_relative(cls, value: str) -> str:
        # A manifest entry is a path inside the commit folder, whatever a listing or an old manifest says.
        reason = unsafe_path_reason(value)
        if reason is not None:
            raise ValueError(f"manifest path {value!r} {reason}")
        return value


class Manifest(BaseModel):
    """Written last: lists every verified object of one commit."""

    repo_id: str
    commit: str
    revision: str
    files: list[StagedFile]
    total_bytes: int
    staged_at: str

    def covers(self, selected: list[HubFile]) -> bool:
        have = {f.path: f for f in self.files}
        return all(
            f.path in have
            and have[f.path].size == f.size
            and have[f.path].git_blob_id == f.git_blob_id
            and (f.lfs_sha256 is None or have[f.path].sha256 == f.lfs_sha256)
            for f in selected
        )


class StagingResult(BaseModel):
    """What later steps and the promotion report use."""

    repo_id: str
    commit: str
    uri: str = Field(description="gs:// folder of the commit; serving points here.")
    object_prefix: str = Field(description="Object prefix of the commit inside the bucket.")
    files_uploaded: int
    files_skipped: int
    bytes_uploaded: int
    bytes_skipped: int
    total_bytes: int
    seconds: float
    mb_per_s: float
    noop: bool = Field(description="The manifest was already complete: nothing was read from the Hub.")
    rate_limit_waits: int = Field(0, description="Waits the Hub asked for with 429.")
    other_retries: int = Field(0, description="Retries after 5xx or dropped connections.")
    seconds_waited: float = Field(0.0, description="Time spent waiting between Hub retries.")
    uploaded_paths: list[str] = Field(default_factory=list, description="Files this run uploaded (not skipped).")


def commit_prefix(target: GcpTarget, repo_id: str, commit: str) -> str:
    return f"{target.model_prefix}/{repo_id}/{commit}"


def object_name(prefix: str, path: str) -> str:
    """The one place a staged object's name is built: the commit folder plus a plain relative path.

    Selection already refused bad names with the full story; this is the last line of defence, so no code path
    can write outside the commit folder (``..``), into an odd name (``a//b``) or with control characters.
    """
    reason = unsafe_path_reason(path)
    if reason is not None:
        raise StagingError(f"refusing to write {path!r} under {prefix}/: the name {reason}; nothing was written")
    return f"{prefix}/{path}"


def _content_type(path: str) -> str:
    if path.endswith(".json"):
        return "application/json"
    if path.endswith((".txt", ".jinja", ".md", ".model", ".tiktoken")):
        return "text/plain"
    return "application/octet-stream"


def read_manifest(bucket: gcs.Bucket, prefix: str) -> Manifest | None:
    try:
        return Manifest.model_validate_json(bucket.blob(object_name(prefix, MANIFEST)).download_as_bytes())
    except gexc.NotFound:
        return None
    except gexc.Forbidden:
        raise StagingError(_permission_denied(bucket.name)) from None
    except ValueError:
        return None  # unreadable manifest: stage again and rewrite it


def _permission_denied(bucket: str) -> str:
    return (
        f"permission denied on bucket gs://{bucket}: grant the identity running this flow "
        "roles/storage.objectAdmin on it, or set GcpTarget.bucket to a bucket it may write"
    )


def check_bucket(storage: gcs.Client, target: GcpTarget) -> gcs.Bucket:
    """The target's bucket, or an error that names it and says how to fix it."""
    name = target.bucket_name
    try:
        bucket = storage.get_bucket(name)
    except gexc.NotFound:
        raise StagingError(
            f"bucket gs://{name} does not exist: run the ensure-infra step, or create it with `gcloud storage "
            f"buckets create gs://{name} --location={target.region} --uniform-bucket-level-access "
            "--public-access-prevention`"
        ) from None
    except gexc.Forbidden:
        raise StagingError(_permission_denied(name)) from None
    if (bucket.location or "").lower() != target.region:
        raise StagingError(
            f"bucket gs://{name} is in {bucket.location}, the service in {target.region}: weights must sit in the "
            f"service's own region (lesson 18); set GcpTarget.bucket to a bucket in {target.region}, or leave it "
            "empty for the default name"
        )
    return bucket


def _is_verified(blob: gcs.Blob | None, item: HubFile) -> bool:
    if blob is None or blob.size != item.size:
        return False
    metadata = blob.metadata or {}
    if item.lfs_sha256:
        return metadata.get("sha256") == item.lfs_sha256
    return metadata.get("git-blob-id") == item.git_blob_id


class _Uploader:
    """Streams files of one commit into the bucket; thread-safe, one HTTP client and one GCS client."""

    def __init__(
        self,
        bucket: gcs.Bucket,
        prefix: str,
        access: clients.HubAccess,
        resolved: ResolvedModel,
        options: StagingOptions,
        progress: ByteProgress,
        stats: RetryStats,
    ) -> None:
        self.stats = stats
        self.bucket = bucket
        self.prefix = prefix
        self.access = access
        self.resolved = resolved
        self.options = options
        self.progress = progress
        self.http = httpx.Client(
            timeout=httpx.Timeout(60, connect=15),
            limits=httpx.Limits(max_connections=2 * options.parallel_files + 2),
        )
        # Chunk buffers, reused from file to file: at most one per file in flight, so parallel_files x chunk_mib
        # in all, allocated (and page-faulted) once rather than per file.
        self._free_buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()

    def _take_buffer(self, chunk: int) -> bytearray:
        try:
            return self._free_buffers.get_nowait()
        except queue.Empty:
            return bytearray(chunk)

    def upload(self, item: HubFile) -> StagedFile:
        hub_stream = HubFileStream(
            self.http, self.access, self.resolved.repo_id, self.resolved.commit, item, self.options.retry, self.stats
        )
        chunk = self.options.chunk_mib * 1024 * 1024
        buffer = self._take_buffer(chunk) if item.size > SIMPLE_UPLOAD_LIMIT else None
        counted = _CountingStream(hub_stream, self.progress, buffer)
        blob = self.bucket.blob(object_name(self.prefix, item.path), chunk_size=chunk)
        source = f"hf://{self.resolved.repo_id}@{self.resolved.commit}/{item.path}"
        try:
            if item.lfs_sha256 is None and item.size <= SIMPLE_UPLOAD_LIMIT:
                data = counted.read()  # small git files: verified in full before the single upload request
                blob.metadata = self._metadata(hub_stream.digests.sha256.hexdigest(), item, source)
                blob.upload_from_string(data, content_type=_content_type(item.path), checksum=None)
            else:
                # A git (non-LFS) file over 8 MiB is rare (the Hub moves files over 10 MiB to LFS): its sha256 is
                # known only at the end, so its object carries the git blob id and the manifest the sha256.
                blob.metadata = self._metadata(item.lfs_sha256 or "", item, source)
                blob.upload_from_file(
                    counted, size=item.size, content_type=_content_type(item.path), checksum=None, rewind=False
                )
        finally:
            counted.close()
            if buffer is not None:
                self._free_buffers.put(buffer)
        streamed_crc = base64.b64encode(hub_stream.digests.crc32c.digest()).decode()
        if blob.crc32c != streamed_crc:
            blob.delete()
            raise ChecksumMismatch(
                f"gs://{self.bucket.name}/{blob.name}: stored crc32c {blob.crc32c} differs from the streamed "
                f"{streamed_crc}; the object was deleted"
            )
        return StagedFile(
            path=item.path, size=item.size, sha256=hub_stream.digests.sha256.hexdigest(), git_blob_id=item.git_blob_id
        )

    @staticmethod
    def _metadata(sha256: str, item: HubFile, source: str) -> dict[str, str]:
        return {"sha256": sha256, "git-blob-id": item.git_blob_id, "source": source}

    def close(self) -> None:
        self.http.close()


class _CountingStream:
    """Hands the upload each chunk in a buffer reused chunk after chunk, and counts bytes for the progress.

    google-cloud-storage's resumable upload reads one chunk, sends it (retrying that same chunk if needed) and
    only then reads the next (``ResumableUpload.transmit_next_chunk``), so a chunk-sized read can return a view
    of a buffer the next read overwrites; requests and urllib3 send any buffer-protocol body with one
    ``sendall``. A fresh 8 MiB ``bytes`` per chunk cost page faults on every chunk (about 0.3 CPU-s per GiB
    here, issue 16). Should a library ever keep a chunk past the next read, the object's crc32c would differ
    from the streamed one and the object is deleted (``_Uploader.upload``), so this cannot store wrong bytes.
    Without a buffer (files up to SIMPLE_UPLOAD_LIMIT: one multipart request, which takes only ``bytes``),
    reads are plain copies.
    """

    def __init__(self, inner: HubFileStream, progress: ByteProgress, buffer: bytearray | None) -> None:
        self.inner = inner
        self.progress = progress
        self._view = memoryview(buffer) if buffer is not None else None

    def read(self, size: int = -1) -> bytes | memoryview:
        if self._view is not None and 0 < size <= len(self._view):
            count = self.inner.readinto(self._view[:size])
            data: bytes | memoryview = self._view[:count] if count else b""
        else:
            data = self.inner.read(size)
        self.progress.add(len(data))
        return data

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> None:
        self.inner.close()
        self._view = None


def stage_model(
    target: GcpTarget,
    source: ModelSource,
    token: SecretStr | None,
    options: StagingOptions | None = None,
) -> StagingResult:
    """Resolve ``source`` and make ``gs://bucket/prefix/repo/commit/`` hold exactly its verified files."""
    options = options or StagingOptions()
    started = time.monotonic()
    log = run_logger()
    access = clients.hub(source, token)
    stats = RetryStats()
    resolved = resolve_model(access, source, options.retry, stats)
    selected = select_files(
        resolved.files, source.allow_patterns, source.ignore_patterns, source.repo_id, resolved.commit
    )
    total = sum(f.size for f in selected)
    storage = clients.storage(target)
    prefix = commit_prefix(target, source.repo_id, resolved.commit)
    uri = f"gs://{target.bucket_name}/{prefix}"

    manifest = read_manifest(storage.bucket(target.bucket_name), prefix)
    if manifest is not None and manifest.covers(selected):
        log.info("%s@%s is already staged at %s (manifest complete)", source.repo_id, resolved.commit[:12], uri)
        return _result(source, resolved, uri, prefix, [], selected, total, started, stats, noop=True)

    index = index_to_check(selected)
    if index is not None:  # a stale or broken index would stage a folder vLLM cannot load: refuse before uploading
        with httpx.Client(timeout=60) as http:
            index_json = read_json_file(http, access, source.repo_id, resolved.commit, index, options.retry, stats)
        check_index(index_json, selected, resolved.files, source.repo_id)
    bucket = check_bucket(storage, target)
    existing = {b.name: b for b in storage.list_blobs(bucket, prefix=f"{prefix}/")}
    todo = [f for f in selected if not _is_verified(existing.get(object_name(prefix, f.path)), f)]
    skipped = [f for f in selected if f not in todo]
    log.info(
        "staging %s@%s (%s) to %s: %d files to upload (%.1f MB), %d already verified",
        source.repo_id,
        resolved.commit[:12],
        source.revision,
        uri,
        len(todo),
        sum(f.size for f in todo) / 1e6,
        len(skipped),
    )
    progress = ByteProgress(total, sum(f.size for f in skipped), f"staging-{source.repo_id}", f"staging {uri}")
    staged = _upload_all(bucket, prefix, access, resolved, options, progress, stats, todo)
    recorded = {f.path: f for f in staged}
    for item in skipped:
        blob = existing[object_name(prefix, item.path)]
        recorded[item.path] = StagedFile(
            path=item.path, size=item.size, sha256=blob.metadata["sha256"], git_blob_id=item.git_blob_id
        )
    manifest = Manifest(
        repo_id=source.repo_id,
        commit=resolved.commit,
        revision=source.revision,
        files=[recorded[f.path] for f in selected],
        total_bytes=total,
        staged_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    bucket.blob(object_name(prefix, MANIFEST)).upload_from_string(
        json.dumps(manifest.model_dump(), indent=1), content_type="application/json"
    )
    progress.report()
    return _result(source, resolved, uri, prefix, todo, skipped, total, started, stats, noop=False)


def _upload_all(
    bucket: gcs.Bucket,
    prefix: str,
    access: clients.HubAccess,
    resolved: ResolvedModel,
    options: StagingOptions,
    progress: ByteProgress,
    stats: RetryStats,
    todo: list[HubFile],
) -> list[StagedFile]:
    uploader = _Uploader(bucket, prefix, access, resolved, options, progress, stats)
    try:
        with ThreadPoolExecutor(options.parallel_files, thread_name_prefix="stage") as pool:
            # Largest first: the long transfers start early and the small ones fill the gaps. Each file runs in a
            # copy of this task's context, so its Hub waits log on the run logger and show in the UI.
            futures: list[Future[StagedFile]] = [
                pool.submit(contextvars.copy_context().run, uploader.upload, item)
                for item in sorted(todo, key=lambda f: -f.size)
            ]
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                progress.report()
                failed = [f for f in done if f.exception() is not None]
                if failed:
                    for future in pending:
                        future.cancel()
                    wait(pending)  # files in flight finish (they are valid); queued ones never start
                    raise failed[0].exception()  # type: ignore[misc]
            return [f.result() for f in futures]
    finally:
        uploader.close()


def _result(
    source: ModelSource,
    resolved: ResolvedModel,
    uri: str,
    prefix: str,
    uploaded: list[HubFile],
    skipped: list[HubFile],
    total: int,
    started: float,
    stats: RetryStats,
    noop: bool,
) -> StagingResult:
    seconds = time.monotonic() - started
    sent = sum(f.size for f in uploaded)
    return StagingResult(
        repo_id=source.repo_id,
        commit=resolved.commit,
        uri=uri,
        object_prefix=prefix,
        files_uploaded=len(uploaded),
        files_skipped=len(skipped),
        bytes_uploaded=sent,
        bytes_skipped=total - sent,
        total_bytes=total,
        seconds=round(seconds, 3),
        mb_per_s=round(sent / seconds / 1e6, 1) if seconds > 0 else 0.0,
        noop=noop,
        rate_limit_waits=stats.rate_limited,
        other_retries=stats.other,
        seconds_waited=round(stats.waited_s, 2),
        uploaded_paths=[f.path for f in uploaded],
    )


@task(name="hf_stage_model", task_run_name="stage {source.repo_id}@{source.revision}")
def hf_stage_model(
    target: GcpTarget,
    source: ModelSource,
    token_secret_block: str | None = None,
    options: StagingOptions | None = None,
) -> StagingResult:
    """Stream the model's files from the Hugging Face Hub into the target's bucket, verified, manifest last.

    The Hub token comes from the Prefect Secret block named here or in the source, else HF_TOKEN; it never
    appears in parameters, logs or artifacts.
    """
    result = stage_model(target, source, clients.hub_token(source, token_secret_block), options)
    _publish_staged_files(target, result)
    return result


def _publish_staged_files(target: GcpTarget, result: StagingResult) -> None:
    """A table artifact of the commit's files as the manifest records them: what was uploaded, what was there."""
    manifest = read_manifest(clients.storage(target).bucket(target.bucket_name), result.object_prefix)
    if manifest is None:
        return
    uploaded = set(result.uploaded_paths)
    rows = [
        {
            "path": f.path,
            "MB": round(f.size / 1e6, 2),
            "this run": "uploaded" if f.path in uploaded else "already there",
            "sha256": f.sha256[:12],
        }
        for f in manifest.files
    ]
    create_table_artifact(
        rows,
        key=artifact_key(f"staged-files-{result.repo_id}"),
        description=f"{result.repo_id}@{result.commit[:12]} in {result.uri}: {len(uploaded)} of {len(rows)} uploaded",
    )
