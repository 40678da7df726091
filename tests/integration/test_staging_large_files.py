"""Files larger than one upload chunk: the resumable path, where each chunk is read into a buffer reused chunk
after chunk and file after file (issue 16). The small repos of test_staging.py never leave the single-request
path, so these files are 10-14 MB with 1 MiB chunks: a dozen chunks per file through one buffer."""

from __future__ import annotations

import base64
import hashlib
import itertools

import google_crc32c
import httpx
import pytest
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource
from tasks.common import clients
from tasks.weights.hub_errors import ChecksumMismatch
from tasks.weights.hub_retry import HubRetryPolicy
from tasks.weights.staging import MANIFEST, SIMPLE_UPLOAD_LIMIT, StagingOptions, stage_model

_ids = itertools.count()
FAST_RETRY = HubRetryPolicy(backoff_initial_s=0.05, backoff_max_s=0.2)
# One file at a time, so the one buffer carries every chunk of every file in turn.
ONE_BUFFER = StagingOptions(parallel_files=1, chunk_mib=1, retry=FAST_RETRY)


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    fresh = sandbox_target.model_copy(update={"bucket": f"stage-large-{next(_ids)}"})
    clients.storage(fresh).create_bucket(fresh.bucket_name, location=fresh.region)
    return fresh


@pytest.fixture
def repo(sb) -> str:
    """Three shards of about 12 MB each: over the single-request limit, so each is a resumable upload."""
    repo_id = f"stage/large-{next(_ids)}"
    sb.hub(
        "POST",
        "/repos",
        json={
            "repo_id": repo_id,
            "weight_bytes": 36_000_000,
            "shards": 3,
            "include_bin_duplicate": False,
            "include_original": False,
        },
    )
    return repo_id


def _stage(sb, target: GcpTarget, repo_id: str, options: StagingOptions = ONE_BUFFER):
    return stage_model(target, ModelSource(repo_id=repo_id, hub_endpoint=sb.hub_url), SecretStr(sb.hub_token), options)


def _shards(sb, repo_id: str) -> dict[str, dict]:
    files = sb.hub("GET", f"/repos/{repo_id}")["files"]
    return {f["path"]: f for f in files if f["path"].endswith(".safetensors")}


def test_every_chunk_of_every_large_file_arrives_intact(sb, target, repo):
    shards = _shards(sb, repo)
    assert len(shards) == 3 and all(f["size"] > SIMPLE_UPLOAD_LIMIT for f in shards.values())
    result = _stage(sb, target, repo)
    bucket = clients.storage(target).bucket(target.bucket_name)
    for path, hub in shards.items():
        blob = bucket.get_blob(f"{result.object_prefix}/{path}")
        data = blob.download_as_bytes()
        served = httpx.get(f"{sb.hub_url}/{repo}/resolve/{result.commit}/{path}", follow_redirects=True).content
        assert data == served
        assert hashlib.sha256(data).hexdigest() == hub["lfs_sha256"] == blob.metadata["sha256"]
        assert blob.crc32c == base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
    assert bucket.get_blob(f"{result.object_prefix}/{MANIFEST}") is not None


def test_a_connection_dropped_inside_a_chunk_resumes_into_the_same_chunk(sb, target, repo):
    # 1.5 MB is half-way through the second 1 MiB chunk of the first file, 3 MB through its third.
    sb.add_fault("cdn", action="drop", after_bytes=1_500_000, times=2)
    since = sb.last_request_seq()
    result = _stage(sb, target, repo)
    starts = [
        int(r["headers"]["range"].removeprefix("bytes=").rstrip("-"))
        for r in sb.requests("cdn", since=since)
        if "range" in r["headers"]
    ]
    # Resumed where each connection broke (the second drop hits the resumed request), never restarted.
    assert starts == [1_500_000, 3_000_000]
    bucket = clients.storage(target).bucket(target.bucket_name)
    for path, hub in _shards(sb, repo).items():
        data = bucket.blob(f"{result.object_prefix}/{path}").download_as_bytes()
        assert hashlib.sha256(data).hexdigest() == hub["lfs_sha256"]


def test_a_corrupt_large_file_never_finalizes_although_its_first_chunks_were_sent(sb, target, repo):
    # The first byte of the first download is flipped: a dozen chunks go to the resumable session before the last
    # one would, and the sha256 check at the end keeps that last chunk back, so that object never exists. (A file
    # already in flight when the failure is seen may finish: it is verified like any other.)
    sb.add_fault("cdn", action="corrupt", times=1)
    with pytest.raises(ChecksumMismatch, match="content does not match the Hub's sha256") as failure:
        _stage(sb, target, repo)
    corrupt = next(path for path in _shards(sb, repo) if path in str(failure.value))
    stored = {b.name.rsplit("/", 1)[-1]: b for b in clients.storage(target).list_blobs(target.bucket_name)}
    assert corrupt not in stored
    assert MANIFEST not in stored
    shards = _shards(sb, repo)
    for name, blob in stored.items():
        assert hashlib.sha256(blob.download_as_bytes()).hexdigest() == shards[name]["lfs_sha256"]
