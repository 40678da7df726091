"""What the fault-injection tests (tests/reliability/test_faults_*.py, issue 8) share: promotions as a user runs
them, and the proofs that every staged byte is the Hub's and was uploaded once.

Each test asserts one of two outcomes: the promotion completes, with every staged byte verified against the
Hub's listing and traffic moved to the new revision; or it fails cleanly, with traffic where it was. Where
weights are staged, a ``_manifest.json`` exists only when every object it lists carries the Hub's digest, and
no object is uploaded twice. Faults go in over HTTP (sandbox/faults.py, the Cloud Run stand-in's instance
faults, forced Cloud Build outcomes); product code is never patched.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from flows.promote import promote_model
from tasks.common import clients
from tasks.deploy.probe import VerifyOptions
from tasks.report.report import PromotionReport
from tasks.weights.staging import MANIFEST
from tests.support.delivery import NO_WATCH
from tests.support.identity import bearer

FAST = VerifyOptions(health_period_s=0.05)
TOKEN_BLOCK = "sandbox-hf-token"
TINY = "sandbox/tiny-chat"  # main, dev (other weights) and tag v1.0: three commits, three revisions
CHAT = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ROOT = Path(__file__).resolve().parents[2]  # the project folder
_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def new_repo(sb, weight_bytes: int = 2_000_000, shards: int = 2) -> str:
    """A freshly generated Hub repo, so the promotion really stages (nothing of it is in the bucket yet)."""
    repo_id = f"faults/{unique('model')}"
    sb.hub("POST", "/repos", json={"repo_id": repo_id, "weight_bytes": weight_bytes, "shards": shards})
    return repo_id


def promote(model: str, service: str, **kwargs):
    """promote-model as a user runs it; the final flow-run state (Completed or Failed), never an exception."""
    return promote_model(
        model=model,
        service=service,
        token_secret_block=TOKEN_BLOCK,
        verify=FAST,
        return_state=True,
        **{"watch": NO_WATCH, **kwargs},
    )


def completed(state) -> PromotionReport:
    assert state.is_completed(), f"the promotion did not complete: {state.message}"
    return state.result()


def traffic(target, service: str) -> list[tuple[str, int, str]]:
    """The service's traffic as Cloud Run reports it: (revision, percent, tag), candidate tags included."""
    found = clients.run_services(target).get_service(name=f"{target.location_path}/services/{service}")
    return [(s.revision, s.percent, s.tag) for s in found.traffic_statuses]


def answering_revision(service_url: str) -> str:
    response = httpx.post(f"{service_url}/v1/chat/completions", headers=bearer(service_url), json=CHAT, timeout=30)
    response.raise_for_status()
    return response.headers["x-sandbox-revision"]


def hub_files(sb, repo_id: str, revision: str) -> dict[str, dict]:
    return {f["path"]: f for f in sb.hub("GET", f"/repos/{repo_id}", params={"revision": revision})["files"]}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def assert_verified_against_hub(sb, target, repo_id: str, commit: str, object_prefix: str) -> int:
    """Download every object of a staged commit: its bytes hash to the Hub's digest, its metadata says so, and the
    manifest lists exactly these objects. Returns the number of objects, the manifest included."""
    listing = hub_files(sb, repo_id, commit)
    prefix = f"{object_prefix}/"
    blobs = {
        b.name.removeprefix(prefix): b for b in clients.storage(target).list_blobs(target.bucket_name, prefix=prefix)
    }
    manifest = json.loads(blobs.pop(MANIFEST).download_as_bytes())
    assert (manifest["repo_id"], manifest["commit"]) == (repo_id, commit)
    assert sorted(f["path"] for f in manifest["files"]) == sorted(blobs)
    for path, blob in blobs.items():
        hub, data = listing[path], blob.download_as_bytes()
        assert len(data) == hub["size"], path
        if hub["lfs_sha256"]:
            assert hashlib.sha256(data).hexdigest() == hub["lfs_sha256"] == blob.metadata["sha256"], path
        else:
            assert git_blob_id(data) == hub["oid"] == blob.metadata["git-blob-id"], path
    return len(blobs) + 1


def completed_uploads(sb, since: int, bucket: str) -> int:
    """Uploads that stored an object: one-request (multipart) uploads and the final chunk of resumable ones. The run's
    report, archived create-only beside the weights (tasks/report/archive.py), is not counted."""
    path = f"/upload/storage/v1/b/{bucket}/o"
    return sum(
        1
        for r in sb.requests("gcs", since=since)
        if r["path"] == path
        and r["status"] == 200
        and "ifGenerationMatch=0" not in r["query"]
        and (
            (r["method"] == "POST" and "uploadType=multipart" in r["query"])
            or (r["method"] == "PUT" and "upload_id=" in r["query"])
        )
    )


def assert_staged_once_and_verified(sb, target, report: PromotionReport, since: int) -> None:
    assert report.staging is not None and not report.staging.noop
    staged = report.staging
    objects = assert_verified_against_hub(sb, target, staged.repo_id, staged.commit, staged.object_prefix)
    assert report.staging.files_uploaded == objects - 1
    assert completed_uploads(sb, since, target.bucket_name) == objects  # nothing uploaded twice


def run_in_threads(calls: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Start every call at once (a barrier), wait for all; each result is its return value or its exception."""
    results: dict[str, object] = {}
    barrier = threading.Barrier(len(calls))

    def run(name: str, call: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[name] = call()
        except BaseException as exc:  # reported by the caller's assertions
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
