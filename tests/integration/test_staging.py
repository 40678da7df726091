"""Staging weights from the Hub stand-in into the GCS emulator with the real clients."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource
from sandbox.config import SANDBOX_HF_TOKEN_NO_ACCESS
from sandbox.serving import free_port
from tasks.common import clients
from tasks.weights.hub_errors import (
    ChecksumMismatch,
    HubAccessDenied,
    HubNotFound,
    HubRateLimitExhausted,
    HubUnavailable,
    HubUnreachable,
)
from tasks.weights.hub_retry import HubRetryPolicy
from tasks.weights.staging import MANIFEST, StagingError, StagingOptions, stage_model

_ids = itertools.count()
FAST_RETRY = HubRetryPolicy(backoff_initial_s=0.05, backoff_max_s=0.2)


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    """The sandbox target with a fresh, empty bucket in its region."""
    fresh = sandbox_target.model_copy(update={"bucket": f"stage-test-{next(_ids)}"})
    clients.storage(fresh).create_bucket(fresh.bucket_name, location=fresh.region)
    return fresh


@pytest.fixture
def repo(sb) -> str:
    """A freshly generated repo: ~6 MB in 3 shards, plus the .bin and original/ duplicates."""
    repo_id = f"stage/model-{next(_ids)}"
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "weight_bytes": 6_000_000, "shards": 3})
    return repo_id


def source(sb, repo_id: str, **kwargs) -> ModelSource:
    return ModelSource(repo_id=repo_id, hub_endpoint=sb.hub_url, **kwargs)


def token(sb) -> SecretStr:
    return SecretStr(sb.hub_token)


def hub_files(sb, repo_id: str, revision: str = "main") -> dict[str, dict]:
    return {f["path"]: f for f in sb.hub("GET", f"/repos/{repo_id}", params={"revision": revision})["files"]}


def objects(target: GcpTarget, prefix: str) -> dict[str, bytes]:
    storage = clients.storage(target)
    return {
        b.name.removeprefix(prefix + "/"): b.download_as_bytes()
        for b in storage.list_blobs(target.bucket_name, prefix=prefix + "/")
    }


def test_full_stage_is_verified_byte_for_byte(sb, target, repo):
    result = stage_model(target, source(sb, repo), token(sb))
    expected = hub_files(sb, repo)
    assert result.uri == f"gs://{target.bucket_name}/model-cache/{repo}/{result.commit}"
    stored = objects(target, result.object_prefix)
    assert MANIFEST in stored
    staged = {path: data for path, data in stored.items() if path != MANIFEST}
    assert set(staged) == {p for p in expected if "/" not in p and not p.endswith((".bin", ".md", ".gitattributes"))}
    for path, data in staged.items():
        hub = expected[path]
        assert len(data) == hub["size"]
        if hub["lfs_sha256"]:
            assert hashlib.sha256(data).hexdigest() == hub["lfs_sha256"]
        else:
            assert hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest() == hub["oid"]
        served = httpx.get(f"{sb.hub_url}/{repo}/resolve/{result.commit}/{path}", follow_redirects=True).content
        assert data == served
    manifest = json.loads(stored[MANIFEST])
    assert manifest["commit"] == result.commit and manifest["repo_id"] == repo
    assert {f["path"] for f in manifest["files"]} == set(staged)
    assert manifest["total_bytes"] == sum(len(d) for d in staged.values()) == result.total_bytes
    metadata = (
        clients.storage(target)
        .bucket(target.bucket_name)
        .get_blob(f"{result.object_prefix}/model-00001-of-00003.safetensors")
        .metadata
    )
    assert metadata["sha256"] == expected["model-00001-of-00003.safetensors"]["lfs_sha256"]
    assert metadata["source"] == f"hf://{repo}@{result.commit}/model-00001-of-00003.safetensors"
    assert (result.files_uploaded, result.files_skipped, result.noop) == (len(staged), 0, False)


def test_second_run_is_a_no_op_in_one_hub_call(sb, target, repo):
    first = stage_model(target, source(sb, repo), token(sb))
    since = sb.last_request_seq()
    second = stage_model(target, source(sb, repo), token(sb))
    assert second.noop and second.files_uploaded == 0 and second.bytes_uploaded == 0
    assert second.commit == first.commit
    hub_calls = [r for r in sb.requests(since=since) if r["server"] in ("hub", "cdn")]
    assert [(r["method"], r["path"]) for r in hub_calls] == [("GET", f"/api/models/{repo}/revision/main")]


def test_revision_by_tag_branch_and_sha_lands_in_its_commit_folder(sb, target):
    tags = sb.hub("GET", "/repos/sandbox/tiny-chat")
    by_tag = stage_model(target, source(sb, "sandbox/tiny-chat", revision="v1.0"), token(sb))
    by_branch = stage_model(target, source(sb, "sandbox/tiny-chat", revision="dev"), token(sb))
    assert by_tag.commit == tags["tags"]["v1.0"] and by_branch.commit == tags["branches"]["dev"]
    by_sha = stage_model(target, source(sb, "sandbox/tiny-chat", revision=by_tag.commit), token(sb))
    assert by_sha.noop and by_sha.uri == by_tag.uri != by_branch.uri


def test_gated_repo_without_a_token_fails_before_any_download(sb, target):
    since = sb.last_request_seq()
    with pytest.raises(HubAccessDenied, match=r"sandbox/gated-chat is gated: accept its licence at"):
        stage_model(target, source(sb, "sandbox/gated-chat"), None)
    assert [r["path"] for r in sb.requests("hub", since=since)] == ["/api/models/sandbox/gated-chat/revision/main"]


def test_gated_repo_with_a_token_that_lacks_access_fails_at_once(sb, target):
    since = sb.last_request_seq()
    with pytest.raises(HubAccessDenied, match="is gated: accept its licence") as caught:
        stage_model(target, source(sb, "sandbox/gated-chat"), SecretStr(SANDBOX_HF_TOKEN_NO_ACCESS))
    assert SANDBOX_HF_TOKEN_NO_ACCESS not in str(caught.value)
    downloads = [r for r in sb.requests("hub", since=since) if "/resolve/" in r["path"]]
    assert all(r["status"] == 403 for r in downloads)
    assert len(downloads) == len({r["path"] for r in downloads})  # no retries
    assert list(clients.storage(target).list_blobs(target.bucket_name)) == []


def test_private_repo_without_a_token_is_named_with_the_fix_and_stages_with_one(sb, target):
    repo_id = f"stage/private-{next(_ids)}"
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "private": True, "weight_bytes": 1_000_000, "shards": 1})
    since = sb.last_request_seq()
    with pytest.raises(HubNotFound) as caught:  # the Hub answers as for a missing repo: it does not say "private"
        stage_model(target, source(sb, repo_id), None)
    assert f"repo {repo_id} not found" in str(caught.value) and "or it is private" in str(caught.value)
    assert "token_secret_block" in str(caught.value)
    assert not [r for r in sb.requests("hub", since=since) if "/resolve/" in r["path"]]  # nothing downloaded
    assert list(clients.storage(target).list_blobs(target.bucket_name, prefix=f"{target.model_prefix}/{repo_id}")) == []
    assert stage_model(target, source(sb, repo_id), token(sb)).files_uploaded > 0


def test_gated_repo_with_the_right_token_stages(sb, target):
    assert stage_model(target, source(sb, "sandbox/gated-chat"), token(sb)).files_uploaded > 0


@pytest.mark.parametrize(
    ("repo_id", "revision", "expected"),
    [
        ("stage/does-not-exist", "main", "repo stage/does-not-exist not found"),
        ("sandbox/tiny-chat", "no-such-branch", "revision not found in sandbox/tiny-chat"),
    ],
)
def test_missing_repo_or_revision_names_it(sb, target, repo_id, revision, expected):
    with pytest.raises(HubNotFound, match=expected):
        stage_model(target, source(sb, repo_id, revision=revision), token(sb))


def test_a_file_missing_at_download_fails_with_its_name(sb, target, repo):
    sb.add_fault("hub", path=r"/resolve/.*/tokenizer\.json$", status=404, headers={"X-Error-Code": "EntryNotFound"})
    with pytest.raises(HubNotFound, match=rf"downloading {repo}/tokenizer\.json: not found"):
        stage_model(target, source(sb, repo), token(sb))


def test_half_of_all_hub_requests_answered_429_still_stages_every_byte(sb, target, repo, caplog):
    for server in ("hub", "cdn"):
        sb.add_fault(server, status=429, retry_after="1", fraction=0.5, seed=7)
    caplog.set_level(logging.WARNING, logger="hf_cloudrun")
    started = time.monotonic()
    # One file at a time keeps the order of requests, and so the seeded storm, the same on every run.
    result = stage_model(target, source(sb, repo), token(sb), StagingOptions(parallel_files=1))
    elapsed = time.monotonic() - started
    fired = sum(rule["fired"] for rule in sb.faults())
    assert fired >= 3
    waits = [r.getMessage() for r in caplog.records if "rate limited by the Hub" in r.getMessage()]
    assert len(waits) == fired
    assert all(" waiting 1 s, attempt " in w for w in waits)  # Retry-After: 1, plus at most 10 % jitter
    assert elapsed >= 1  # at least one Retry-After was honoured in full
    assert result.rate_limit_waits == fired and result.seconds_waited >= fired
    stored = objects(target, result.object_prefix)
    expected = hub_files(sb, repo)
    for path, data in stored.items():
        if path != MANIFEST and expected[path]["lfs_sha256"]:
            assert hashlib.sha256(data).hexdigest() == expected[path]["lfs_sha256"]


def test_resolution_is_retried_on_429_although_huggingface_hub_would_not(sb, target, repo, caplog):
    sb.add_fault("hub", path="^/api/models/", status=429, retry_after="1", times=2)
    caplog.set_level(logging.WARNING, logger="hf_cloudrun")
    assert stage_model(target, source(sb, repo), token(sb)).files_uploaded > 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("rate limited by the Hub, waiting 1 s, attempt 2 of 8 (resolving" in m for m in messages)
    assert any("attempt 3 of 8 (resolving" in m for m in messages)


def test_rate_limit_budget_ends_with_a_clear_error(sb, target, repo):
    sb.add_fault("hub", path="^/api/models/", status=429, retry_after="1")
    policy = HubRetryPolicy(budget_s=1.5)
    with pytest.raises(HubRateLimitExhausted, match=r"kept rate limiting .* \(HTTP 429\); gave up .*set a token"):
        stage_model(target, source(sb, repo), token(sb), StagingOptions(retry=policy))


def test_a_hub_that_cannot_be_reached_is_named_unreachable_with_the_endpoint(target, repo):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused
    with pytest.raises(HubUnreachable) as raised:
        stage_model(target, ModelSource(repo_id=repo, hub_endpoint=closed), None, StagingOptions(retry=FAST_RETRY))
    message = str(raised.value)
    assert f"no connection to {closed} (from the model source's hub_endpoint) could be opened" in message
    assert "ConnectError" in message and "unreachable" in message
    # Nothing was rate limited and no token would help: the message must not send the user after one.
    assert "rate limit" not in message.lower() and "token" not in message.lower()


def test_an_unreachable_hub_from_hf_endpoint_says_so(target, repo, monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(HubUnreachable, match=rf"{closed} \(from the HF_ENDPOINT environment variable\)"):
        stage_model(target, ModelSource(repo_id=repo), None, StagingOptions(retry=FAST_RETRY))


def test_a_hub_failing_with_5xx_is_named_failing_not_rate_limited(sb, target, repo):
    sb.add_fault("hub", path="^/api/models/", status=503)
    with pytest.raises(HubUnavailable, match=r"kept answering HTTP 503 .*; gave up .*run again later") as raised:
        stage_model(
            target, source(sb, repo), token(sb), StagingOptions(retry=FAST_RETRY.model_copy(update={"max_attempts": 3}))
        )
    assert "rate limit" not in str(raised.value).lower()


def test_a_dropped_connection_resumes_where_it_stopped(sb, target, repo):
    sb.add_fault("cdn", action="drop", after_bytes=300_000, times=2)
    since = sb.last_request_seq()
    result = stage_model(target, source(sb, repo), token(sb), StagingOptions(retry=FAST_RETRY))
    ranged = [r for r in sb.requests("cdn", since=since) if "range" in r["headers"]]
    starts = [int(r["headers"]["range"].removeprefix("bytes=").rstrip("-")) for r in ranged]
    assert len(starts) == 2 and all(0 < start <= 300_000 for start in starts)  # resumed, not restarted
    assert result.files_uploaded == len(objects(target, result.object_prefix)) - 1


# What us.gcp.cdn.hf.co answered Google Cloud egress for its own signed URLs (huggingface/xet-core issue 897).
CDN_SIGNATURE_ERROR = "<Error><Code>SignatureError</Code><Message>invalid key pair id</Message></Error>"


def test_a_cdn_refusing_its_signed_url_once_is_asked_through_a_fresh_resolve(sb, target, repo):
    sb.add_fault("cdn", method="GET", status=403, body=CDN_SIGNATURE_ERROR, times=1)
    since = sb.last_request_seq()
    result = stage_model(target, source(sb, repo), token(sb), StagingOptions(retry=FAST_RETRY, parallel_files=1))
    assert result.files_uploaded >= 3
    refused = [r for r in sb.requests("cdn", since=since) if r["status"] == 403]
    assert len(refused) == 1
    # The refused file was resolved at the Hub twice: a fresh signature, not a resume of the refused URL.
    resolved = [r["path"] for r in sb.requests("hub", since=since) if "/resolve/" in r["path"]]
    assert any(resolved.count(path) == 2 for path in resolved)


def test_a_cdn_that_keeps_refusing_is_named_not_the_token(sb, target, repo):
    sb.add_fault("cdn", method="GET", status=403, body=CDN_SIGNATURE_ERROR)
    cdn_host = httpx.URL(sb.info["cdn_url"]).host
    with pytest.raises(HubAccessDenied) as refused:
        stage_model(target, source(sb, repo), token(sb), StagingOptions(retry=FAST_RETRY, parallel_files=1))
    message = str(refused.value)
    assert f"the CDN host {cdn_host} refused the URL the Hub had signed (HTTP 403 SignatureError), twice" in message
    assert "The token is not the cause" in message and "xet-core issue 897" in message
    assert "set a token" not in message


def test_a_gated_refusal_names_the_fine_grained_tokens_permission(sb, target):
    with pytest.raises(HubAccessDenied) as refused:
        stage_model(target, source(sb, "sandbox/gated-chat"), SecretStr(SANDBOX_HF_TOKEN_NO_ACCESS))
    assert "'Read access to contents of all public gated repos you can access'" in str(refused.value)


def test_a_corrupted_body_leaves_no_object_and_no_manifest(sb, target, repo):
    sb.add_fault("cdn", action="corrupt")
    with pytest.raises(ChecksumMismatch, match="content does not match the Hub's sha256"):
        stage_model(target, source(sb, repo), token(sb), StagingOptions(parallel_files=1))
    names = [b.name for b in clients.storage(target).list_blobs(target.bucket_name)]
    assert not any(n.endswith(".safetensors") for n in names)
    assert not any(n.endswith(MANIFEST) for n in names)


def test_a_killed_stage_is_finished_by_a_rerun_that_uploads_only_the_rest(sb, target, repo, sandbox_target):
    # One shard crawls, so the others are stored when the process dies.
    sb.add_fault("cdn", action="slow", delay_s=0.5, path=".*", times=1)
    spec = {
        "target": target.model_dump(mode="json", exclude={"gcp_credentials"}),
        "source": source(sb, repo).model_dump(mode="json"),
        "token": sb.hub_token,
        "options": {"parallel_files": 4},
    }
    child = subprocess.Popen([sys.executable, "-m", "tests.support.stage_in_subprocess", json.dumps(spec)])
    storage = clients.storage(target)
    deadline = time.monotonic() + 60
    stored: list[str] = []
    while time.monotonic() < deadline and child.poll() is None:
        stored = [b.name for b in storage.list_blobs(target.bucket_name)]
        if len([n for n in stored if n.endswith(".safetensors")]) >= 2:
            break
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    stored = [b.name for b in storage.list_blobs(target.bucket_name)]
    assert not any(n.endswith(MANIFEST) for n in stored)
    sb.clear_faults()
    result = stage_model(target, source(sb, repo), token(sb))
    assert result.files_skipped == len(stored)
    assert result.files_uploaded == len(objects(target, result.object_prefix)) - 1 - len(stored)
    assert result.files_uploaded > 0


def test_bucket_missing_or_in_another_region_is_named(sb, sandbox_target, repo):
    missing = sandbox_target.model_copy(update={"bucket": "no-such-bucket-here"})
    with pytest.raises(StagingError, match=r"bucket gs://no-such-bucket-here does not exist: run the ensure-infra"):
        stage_model(missing, source(sb, repo), token(sb))
    elsewhere = sandbox_target.model_copy(update={"bucket": f"eu-bucket-{next(_ids)}"})
    clients.storage(elsewhere).create_bucket(elsewhere.bucket_name, location="europe-west4")
    with pytest.raises(StagingError, match=r"is in EUROPE-WEST4, the service in us-central1: .*\(lesson 18\)"):
        stage_model(elsewhere, source(sb, repo), token(sb))


@pytest.mark.parametrize("denied", ["bucket", "manifest"])
def test_permission_denied_on_the_bucket_names_the_role(sb, target, repo, denied):
    path = {"bucket": "/storage/v1/b/{}$", "manifest": "/download/storage/v1/b/{}/o/"}[denied]
    sb.add_fault("gcs", path="^" + path.format(target.bucket_name), method="GET", status=403)
    with pytest.raises(
        StagingError,
        match=rf"permission denied on bucket gs://{target.bucket_name}: grant .* roles/storage\.objectAdmin",
    ):
        stage_model(target, source(sb, repo), token(sb))


def test_the_token_never_leaks(sb, target, caplog):
    secret = sb.hub_token
    caplog.set_level(logging.DEBUG)
    sb.add_fault("cdn", status=500, times=1)
    since = sb.last_request_seq()
    stage_model(target, source(sb, "sandbox/gated-chat"), token(sb), StagingOptions(retry=FAST_RETRY))
    assert secret not in caplog.text
    assert all("authorization" not in r["headers"] for r in sb.requests("cdn", since=since))
    assert any(r["headers"].get("authorization") == f"Bearer {secret}" for r in sb.requests("hub", since=since))
    manifest = clients.storage(target).bucket(target.bucket_name).list_blobs()
    assert all(secret not in json.dumps(b.metadata or {}) for b in manifest)


def test_crc32c_of_every_object_matches_its_content(sb, target, repo):
    import google_crc32c

    result = stage_model(target, source(sb, repo), token(sb))
    for blob in clients.storage(target).list_blobs(target.bucket_name, prefix=result.object_prefix):
        data = blob.download_as_bytes()
        assert blob.crc32c == base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
