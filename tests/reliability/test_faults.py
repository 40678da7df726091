"""Fault injection (issue 8): what a user notices when the Hub, Cloud Storage, the control plane or the process
running the flow misbehaves during a promotion.

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
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from google.api_core.exceptions import NotFound
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.settings import PREFECT_API_URL

from blocks import ServingProfile
from flows.common import service_lock_name
from flows.promote import promote_model
from flows.scale import scale_service
from tasks import clients, infra
from tasks.probe import VerifyOptions
from tasks.report import PromotionReport
from tasks.staging import MANIFEST, commit_prefix
from tests.support.artifacts import report_artifact
from tests.support.delivery import NO_WATCH
from tests.support.identity import bearer
from tests.support.locks import lock_slots, wait_until

pytestmark = pytest.mark.prefect
FAST = VerifyOptions(health_period_s=0.05)
TOKEN_BLOCK = "sandbox-hf-token"
TINY = "sandbox/tiny-chat"  # main, dev (other weights) and tag v1.0: three commits, three revisions
CHAT = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()


# Helpers ------------------------------------------------------------------------------------------------------
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
    """Uploads that stored an object: one-request (multipart) uploads and the final chunk of resumable ones."""
    path = f"/upload/storage/v1/b/{bucket}/o"
    return sum(
        1
        for r in sb.requests("gcs", since=since)
        if r["path"] == path
        and r["status"] == 200
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


@pytest.fixture
def build_profile(tmp_path):
    """Save a ServingProfile block (l4) that builds its image with Cloud Build from a fresh local folder."""

    def make() -> str:
        name = unique("flt-build")
        src = tmp_path / name
        src.mkdir()
        (src / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
        (src / "app.py").write_text(f"print({name!r})\n")  # a new tree, so a new content tag and a real build
        build = {"source_dir": str(src), "image_name": name}
        ServingProfile.preset("l4", image=None, build=build).save(name, overwrite=True)
        return name

    return make


# 1-3. The Hub --------------------------------------------------------------------------------------------------
def test_half_of_all_hub_requests_rate_limited_for_a_whole_promotion(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-429")
    # With seed 27 and this flow's requests (3 sequential Hub calls, then 9 files on 4 threads), a simulation of
    # 2000 interleavings never needs more than 3 of the policy's 8 attempts: a heavy storm, deterministic enough.
    for server in ("hub", "cdn"):
        sb.add_fault(server, status=429, retry_after="1", fraction=0.5, seed=27)
    since = sb.last_request_seq()
    state = promote(repo, service)
    report = completed(state)
    calls = [r for r in sb.requests(since=since) if r["server"] in ("hub", "cdn")]
    limited = [r for r in calls if r["status"] == 429]
    assert limited and all(r["fault"] for r in limited)
    assert report.outcome == "promoted"
    assert report.staging.rate_limit_waits > 0
    assert report.staging.seconds_waited >= report.staging.rate_limit_waits  # each waited the Retry-After in full
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_connections_dropped_mid_file_resume_with_range_requests(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-drop")
    sb.add_fault("cdn", action="drop", after_bytes=300_000, times=3)
    since = sb.last_request_seq()
    report = completed(promote(repo, service))
    cdn = sb.requests("cdn", since=since)
    starts = [int(r["headers"]["range"].removeprefix("bytes=").rstrip("-")) for r in cdn if "range" in r["headers"]]
    assert len(starts) == 3 and all(0 < start <= 300_000 for start in starts)  # resumed where they stopped
    assert sum(1 for r in cdn if "range" not in r["headers"]) == 3  # each shard was started once, never restarted
    shard_lookups = [r for r in sb.requests("hub", since=since) if r["path"].endswith(".safetensors")]
    assert len(shard_lookups) == 3  # resumes went to the signed CDN URL without asking the Hub again
    assert report.staging.other_retries >= 3
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_bursts_of_500_from_the_hub(sb, flow_env):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-500")
    sb.add_fault("hub", path="^/api/models/", status=500, times=1)  # the revision lookup
    sb.add_fault("hub", path=r"/resolve/.*\.safetensors$", status=500, times=3)  # the shards, in parallel
    since = sb.last_request_seq()
    report = completed(promote(repo, service))
    assert [rule["fired"] for rule in sb.faults()] == [1, 3]
    assert sum(1 for r in sb.requests("hub", since=since) if r["status"] == 500) == 4
    assert report.staging.other_retries >= 3
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


# 4. The process killed at ten points of a promotion ------------------------------------------------------------
class ManifestWatch:
    """Watches one repo's folder in the bucket from a thread: whenever a ``_manifest.json`` is there, every object
    it lists must be there too, with the Hub's size and digest in its metadata. Any other sighting is recorded."""

    def __init__(self, target, repo_id: str) -> None:
        self.target = target
        self.root = f"{target.model_prefix}/{repo_id}/"
        self.listings: dict[str, dict[str, dict]] = {}  # commit -> the Hub's files, registered before staging
        self.manifests: dict[str, dict] = {}
        self.violations: list[str] = []
        self.checks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def expect(self, commit: str, listing: dict[str, dict]) -> None:
        self.listings[commit] = listing

    def __enter__(self) -> ManifestWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        storage = clients.storage(self.target)  # a client of its own: this runs beside the test's calls
        while not self._stop.is_set():
            try:
                self.check(storage)
            except Exception as exc:  # the watch must not die quietly
                self.violations.append(f"watch failed: {exc!r}")
            self._stop.wait(0.2)

    def check(self, storage=None) -> None:
        storage = storage or clients.storage(self.target)
        try:
            listed = list(storage.list_blobs(self.target.bucket_name, prefix=self.root))
        except NotFound:
            listed = []  # the first promotion has not created the bucket yet
        blobs = {b.name.removeprefix(self.root): b for b in listed}
        for name, blob in blobs.items():
            commit, _, path = name.partition("/")
            if path != MANIFEST:
                continue
            if commit not in self.listings:
                self.violations.append(f"a manifest for an unexpected commit {commit}")
                continue
            if commit not in self.manifests:
                self.manifests[commit] = json.loads(blob.download_as_bytes())
            for item in self.manifests[commit]["files"]:
                if not self._verified(commit, item["path"], blobs.get(f"{commit}/{item['path']}")):
                    self.violations.append(f"{commit}: the manifest lists {item['path']}, not stored verified")
        self.checks += 1

    def _verified(self, commit: str, path: str, stored) -> bool:
        hub = self.listings[commit].get(path)
        if hub is None or stored is None or stored.size != hub["size"]:
            return False
        key, value = ("sha256", hub["lfs_sha256"]) if hub["lfs_sha256"] else ("git-blob-id", hub["oid"])
        return (stored.metadata or {}).get(key) == value


def child_env(sb, tmp_path: Path) -> dict[str, str]:
    """The child talks to this session's Prefect API (blocks, per-service lock) and the sandbox's Hub."""
    return {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "HF_ENDPOINT": sb.hub_url,
        "PYTHONUNBUFFERED": "1",
    }


def start_child(params: dict, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``python -m tests.support.promote_in_subprocess``: it imports, prints ``ready``, then waits for ``go``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.support.promote_in_subprocess", json.dumps(params)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True,
        )  # fmt: skip


def go(child: subprocess.Popen, log: Path) -> float:
    """Start the child's promotion once it is ready; returns when it started (monotonic)."""
    wait_until(lambda: child.poll() is not None or "ready" in log.read_text(), 60, "the child to import")
    assert child.poll() is None, log.read_text()[-3000:]
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    return time.monotonic()


def kill(child: subprocess.Popen) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def release_dead_holders_slot(target, service: str) -> None:
    """What an operator does after a killed run rather than wait for its lease to lapse
    (`prefect gcl update NAME --active-slots 0`). The harness server is ephemeral and runs no repossessor, so
    here a killed holder's slot would never come back; tests/e2e/test_deployments.py shows a real server
    freeing it within the lease."""
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(
            service_lock_name(target, service), GlobalConcurrencyLimitUpdate(active_slots=0)
        )


def test_a_promotion_killed_at_ten_points_is_finished_by_a_rerun(sb, flow_env, tmp_path):
    repo, service = new_repo(sb), unique("flt-kill")
    params = {"model": repo, "service": service, "token_secret_block": TOKEN_BLOCK, "verify": FAST.model_dump()}
    env, rng = child_env(sb, tmp_path), random.Random(8)
    since = sb.last_request_seq()
    commits = [sb.hub("GET", f"/repos/{repo}")["sha"]]
    logs = [tmp_path / f"child-{run}.log" for run in range(11)]
    children: list[subprocess.Popen] = []
    locks_left_held, reruns, duration = 0, [], 0.0
    with ManifestWatch(flow_env, repo) as watch:
        watch.expect(commits[0], hub_files(sb, repo, commits[0]))
        try:
            children.append(start_child(params, env, logs[0]))
            for run in range(11):
                if run:  # new weights on main each time: every run has staging, a revision and a promotion to do
                    commit = sb.hub("POST", f"/repos/{repo}/commits", json={"regenerate_weights": run})["commit"]
                    commits.append(commit)
                    watch.expect(commit, hub_files(sb, repo, commit))
                child = children[run]
                started = go(child, logs[run])
                if run < 10:
                    children.append(start_child(params, env, logs[run + 1]))  # imports while this one works
                if run == 0:
                    # Once to the end (it creates the service): how long a run takes, as the kills will see it.
                    wait_until(lambda: "done" in logs[0].read_text() or children[0].poll() is not None, 120, "it")
                    duration = time.monotonic() - started
                    assert child.wait(timeout=60) == 0, logs[0].read_text()[-3000:]
                    continue
                delay = duration * (run - 1 + rng.random()) / 10  # one kill in each tenth of the run
                time.sleep(max(0.0, started + delay - time.monotonic()))
                kill(child)
                watch.check()  # what the kill left behind
                if lock_slots(flow_env, service):
                    locks_left_held += 1
                    release_dead_holders_slot(flow_env, service)
                report = completed(promote(repo, service))
                reruns.append(report.outcome)
                assert report.commit == commits[-1] and report.outcome in ("promoted", "unchanged"), (run, report)
                assert commits[-1][:7] in report.serving_revision
                assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
        finally:
            for child in children:
                if child.poll() is None:
                    kill(child)
                if child.stdin is not None:
                    child.stdin.close()
    assert reruns.count("promoted") >= 5  # most kills interrupted the work itself, not the exit after it
    assert watch.violations == [] and watch.checks > 10
    assert sorted(watch.manifests) == sorted(commits)
    objects = sum(
        assert_verified_against_hub(sb, flow_env, repo, commit, commit_prefix(flow_env, repo, commit))
        for commit in commits
    )
    assert completed_uploads(sb, since, flow_env.bucket_name) == objects  # over every kill and rerun: once each
    print(f"one run {duration:.1f} s; reruns {reruns}; {locks_left_held} of 10 kills left the service lock held")


def test_a_first_deploy_killed_before_verification_is_verified_by_the_rerun(sb, flow_env, tmp_path):
    repo, service = new_repo(sb), unique("flt-killfirst")
    params = {"model": repo, "service": service, "token_secret_block": TOKEN_BLOCK, "verify": FAST.model_dump()}
    log = tmp_path / "child.log"
    child = start_child(params, child_env(sb, tmp_path), log)
    since = sb.last_request_seq()

    def service_created() -> bool:
        return any(
            r["method"] == "POST" and r["path"].endswith("/services") for r in sb.requests("control", since=since)
        )

    go(child, log)
    try:
        wait_until(service_created, 60, "the child to create the service")  # killed while Cloud Run starts it
    finally:
        kill(child)
    if lock_slots(flow_env, service):
        release_dead_holders_slot(flow_env, service)
    since = sb.last_request_seq()
    report = completed(promote(repo, service))
    assert sb.requests(f"run:{service}:candidate", since=since), "the rerun never called the unverified revision"
    assert report.verification is not None
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
    assert report.traffic == [(report.serving_revision, 100)]


# 5. Cloud Build ------------------------------------------------------------------------------------------------
def test_cloud_build_internal_error_twice_then_success(sb, flow_env, build_profile):
    profile, service = build_profile(), unique("flt-build")
    sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["INTERNAL_ERROR", "INTERNAL_ERROR"]}).raise_for_status()
    try:
        report = completed(promote(TINY, service, profile=profile))
    finally:
        sb.admin.delete("/cloudbuild/outcomes").raise_for_status()
    assert report.image is not None and not report.image.reused
    assert [(a.max_jobs, a.status) for a in report.image.attempts] == [
        (32, "INTERNAL_ERROR"),
        (16, "INTERNAL_ERROR"),
        (8, "SUCCESS"),
    ]
    revision = clients.run_revisions(flow_env).get_revision(
        name=f"{flow_env.location_path}/services/{service}/revisions/{report.serving_revision}"
    )
    assert revision.containers[0].image == report.image.image  # the built image, by digest, runs `vllm serve`
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
    assert answering_revision(report.service_url) == report.serving_revision


# 6. Cloud Run operation errors ---------------------------------------------------------------------------------
def test_a_crashing_revision_fails_cleanly_and_a_503_on_the_update_is_retried(sb, flow_env):
    service = unique("flt-run")
    first = completed(promote(TINY, service))
    # A revision that crashes at start: the flow fails, traffic stays, the report says where it stands.
    sb.run("POST", "/faults", json={"service": service, "faults": {"crash_at_start": "CUDA error: out of memory"}})
    failed = promote(TINY, service, revision="dev")
    assert failed.is_failed() and "DeployFailed" in failed.message and "did not become ready" in failed.message
    assert traffic(flow_env, service) == [(first.serving_revision, 100, "")]  # no candidate tag left either
    assert answering_revision(first.service_url) == first.serving_revision
    text = report_artifact(service)
    assert "NOT promoted" in text and "did not become ready" in text and f"{first.serving_revision} 100 %" in text
    # A 503 on the service update: retried, and the promotion completes.
    sb.add_fault("control", method="PATCH", path=rf"/services/{service}$", status=503, times=1)
    since = sb.last_request_seq()
    second = completed(promote(TINY, service, revision="dev"))
    patches = [r["status"] for r in sb.requests("control", since=since) if r["method"] == "PATCH"]
    assert patches[0] == 503 and patches[1:] and set(patches[1:]) == {200}
    assert (second.outcome, second.previous_revision) == ("promoted", first.serving_revision)
    assert traffic(flow_env, service) == [(second.serving_revision, 100, "")]


# 7. 429 and 503 from every API the promotion calls -------------------------------------------------------------
# (server, method, path regex). Secret Manager is absent: promote-model never calls it (the Hub token stays in a
# Prefect Secret block and the serving revision needs none).
SURVIVED = [
    ("control", None, r"^/compute/v1/"),  # network, subnet
    ("control", None, r"^/v1/projects/[^/]+/serviceAccounts"),  # IAM service account
    ("control", None, r"/repositories"),  # Artifact Registry repository and the built image's tag
    ("control", "GET", r"/builds/"),  # Cloud Build: reading the finished build back
    ("control", "GET", r"^/v2/.*/services/[^/:]+$"),  # Cloud Run: service read
    ("control", "PATCH", r"^/v2/.*/services/[^/:]+$"),  # Cloud Run: new revision, then traffic
    ("control", None, r":getIamPolicy$"),  # Cloud Run: invokers
    ("gcs", None, r"^/storage/v1/b/[^/]+$"),  # bucket
    ("gcs", None, r"^/storage/v1/b/[^/]+/iam$"),  # bucket IAM
    ("gcs", None, r"^/download/"),  # manifest read
    ("gcs", None, r"^/storage/v1/b/[^/]+/o$"),  # object listing
    ("gcs", None, r"^/storage/v1/b/[^/]+/o/.+"),  # object metadata (the build source archive)
    ("gcs", None, r"^/upload/"),  # weights, manifest, build source
]


def test_one_429_then_one_503_from_every_api_the_promotion_calls(sb, flow_env, build_profile):
    repo, service = new_repo(sb), unique("flt-apis")
    completed(promote(repo, service))  # the service exists: the next promotion updates it
    profile = build_profile()
    sb.hub("POST", f"/repos/{repo}/commits", json={"regenerate_weights": 7})  # new weights to stage
    for server, method, path in SURVIVED:
        for status in (429, 503):
            sb.add_fault(server, method=method, path=path, status=status, times=1)
    since = sb.last_request_seq()
    report = completed(promote(repo, service, profile=profile))
    unfired = [(r["server"], r["method"], r["path"], r["status"]) for r in sb.faults() if r["fired"] != 1]
    assert unfired == []
    assert report.outcome == "promoted" and [a.status for a in report.image.attempts] == ["SUCCESS"]
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert completed_uploads(sb, since, flow_env.build_bucket_name) == 1  # the build source archive, once
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


# Calls made once per promotion, each behind its own retry: the build's creation and its operation, the Cloud Run
# operation and the revision lookup.
RETRIED_SINGLY = [
    pytest.param(("control", "POST", r"/builds$", 429), id="cloudbuild-create"),
    # A 503 may have created the build: it is looked up by its attempt tag before anything is submitted again.
    pytest.param(("control", "POST", r"/builds$", 503), id="cloudbuild-create-503"),
    pytest.param(("control", "GET", r"^/v1/projects/[^/]+/locations/[^/]+/operations/", 429), id="build-operation"),
    pytest.param(("control", "GET", r"^/v2/projects/[^/]+/locations/[^/]+/operations/", 429), id="run-operation"),
    pytest.param(("control", "GET", r"^/v2/.*/services/[^/]+/revisions/", 503), id="run-get-revision"),
    pytest.param(("control", "GET", r"^/v1/projects/[^/]+/locations/[^/]+/operations/", 503), id="build-operation-503"),
    pytest.param(("control", "GET", r"^/v2/projects/[^/]+/locations/[^/]+/operations/", 503), id="run-operation-503"),
    pytest.param(("control", "GET", r"^/v2/.*/services/[^/]+/revisions/", 429), id="run-get-revision-429"),
    # A new service name: the first deploy creates the service.
    pytest.param(("control", "POST", r"^/v2/projects/[^/]+/locations/[^/]+/services$", 429), id="run-create-429"),
    pytest.param(("control", "POST", r"^/v2/projects/[^/]+/locations/[^/]+/services$", 503), id="run-create-503"),
]


@pytest.mark.parametrize("fault", RETRIED_SINGLY)
def test_a_transient_error_on_a_build_operation_or_revision_call_is_retried(sb, flow_env, build_profile, fault):
    server, method, path, status = fault
    service = unique("flt-retry")
    if "/revisions/" in path:
        completed(promote(TINY, service))  # an existing service, so the update path (revision lookup) runs
    profile = build_profile() if "builds" in path or "/v1/" in path else None
    infra.ensure_artifact_registry(flow_env)  # the registry exists: the v1 operation polled is the build's
    sb.add_fault(server, method=method, path=path, status=status, times=1)
    state = promote(TINY, service, revision="dev", **({"profile": profile} if profile else {}))
    assert [r["fired"] for r in sb.faults()] == [1]
    assert state.is_completed(), f"one transient {status} failed the promotion: {state.message}"


# Bursts of 503 from the Hub: the revision lookup, shard resolves (run in parallel), or both in one promotion.
HUB_503_BURSTS = [
    pytest.param([(r"^/api/models/", 1)], id="revision-lookup"),
    pytest.param([(r"/resolve/.*\.safetensors$", 2)], id="two-shard-resolves"),
    pytest.param([(r"^/api/models/", 1), (r"/resolve/.*\.safetensors$", 2)], id="lookup-and-two-shards"),
]


@pytest.mark.parametrize("bursts", HUB_503_BURSTS)
def test_a_burst_of_503_from_the_hub_is_retried(sb, flow_env, bursts):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-hub503")
    for path, times in bursts:
        sb.add_fault("hub", path=path, status=503, times=times)
    since = sb.last_request_seq()
    state = promote(repo, service)
    assert [r["fired"] for r in sb.faults()] == [times for _, times in bursts]
    report = completed(state)
    assert report.outcome == "promoted"
    assert sum(1 for r in sb.requests("hub", since=since) if r["status"] == 503) == sum(t for _, t in bursts)
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


# 8. Failing candidates while clients call the service ----------------------------------------------------------
# Two failing candidates per case, (instance faults, what the failed flow run says): dev, then v1.0.
FAILING_CANDIDATES = [
    pytest.param(
        ({"crash_at_start": "CUDA error: out of memory"}, "did not become ready"),
        ({"completions_status": 500}, "chat completion answered HTTP 500"),
        id="crash-at-start+completions-500",
    ),
    pytest.param(
        ({"engine_dead_after_requests": 0}, "failed the configured startup probe checks"),  # /health never 200
        ({"served_model_name": "someone/else"}, f"lists ['someone/else'] but not '{TINY}'"),
        id="never-healthy+wrong-model-name",
    ),
]


@pytest.mark.parametrize(("dev_fault", "v1_fault"), FAILING_CANDIDATES)
def test_failing_candidates_never_fail_a_caller(sb, flow_env, dev_fault, v1_fault):
    service = unique("flt-busy")
    first = completed(promote(TINY, service))
    stop = threading.Event()
    seen: list[str] = []
    failures: list[str] = []

    def call() -> None:
        with httpx.Client(headers=bearer(first.service_url), timeout=30) as client:
            while not stop.is_set():
                try:
                    response = client.post(f"{first.service_url}/v1/chat/completions", json=CHAT)
                    if response.status_code == 200:
                        seen.append(response.headers["x-sandbox-revision"])
                    else:
                        failures.append(f"HTTP {response.status_code}")
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    callers = [threading.Thread(target=call) for _ in range(3)]
    for caller in callers:
        caller.start()
    try:
        failed = []
        for revision, (faults, _) in (("dev", dev_fault), ("v1.0", v1_fault)):
            sb.run("POST", "/faults", json={"service": service, "faults": faults})
            failed.append(promote(TINY, service, revision=revision))
    finally:
        stop.set()
        for caller in callers:
            caller.join()
    for state, (_, expected) in zip(failed, (dev_fault, v1_fault), strict=True):
        assert state.is_failed() and expected in state.message, state.message
    assert failures == []
    assert len(seen) >= 20 and set(seen) == {first.serving_revision}
    assert traffic(flow_env, service) == [(first.serving_revision, 100, "")]


# 9. Promotions racing for one service --------------------------------------------------------------------------
def assert_one_history(reports: list[PromotionReport], final: list[tuple[str, int, str]]) -> None:
    """Each promoted run saw the previous one's revision serving: the (previous -> serving) pairs chain into one
    path from "no service" to what serves now. Two interleaved runs would both start from the same revision."""
    edges = [(r.previous_revision, r.serving_revision) for r in reports if r.outcome == "promoted"]
    node, remaining, path = None, list(edges), [None]
    while remaining:
        step = next((edge for edge in remaining if edge[0] == node), None)
        assert step is not None, f"promotions interleaved: none continues from {node} in {edges}"
        remaining.remove(step)
        node = step[1]
        path.append(node)
    assert final == [(node, 100, "")]
    for report in reports:
        if report.outcome == "unchanged":  # it found its own revision already serving all traffic
            assert report.previous_revision == report.serving_revision and report.serving_revision in path


def test_two_then_five_promotions_racing_for_one_service_never_interleave(flow_env):
    service = unique("flt-race")
    reports: list[PromotionReport] = []
    for size in (2, 5):
        revisions = [("main", "dev")[i % 2] for i in range(size)]
        calls = {
            f"{i}-{rev}": (lambda rev=rev: promote(TINY, service, revision=rev)) for i, rev in enumerate(revisions)
        }
        states = run_in_threads(calls)
        reports += [completed(state) for state in states.values()]
    assert sum(r.outcome == "promoted" for r in reports) >= 2
    assert_one_history(reports, traffic(flow_env, service))


# 10. Scale flows racing a promotion ----------------------------------------------------------------------------
def test_scale_flows_racing_a_promotion(sb, flow_env):
    service = unique("flt-scale")
    first = completed(promote(TINY, service))
    since = sb.last_request_seq()
    promotion: dict[str, object] = {}
    runner = threading.Thread(target=lambda: promotion.update(state=promote(TINY, service, revision="dev")))
    runner.start()
    try:
        wait_until(lambda: lock_slots(flow_env, service) == 1, 60, "the promotion to hold the service lock")
        scales = run_in_threads(
            {"min1": lambda: scale_service(service=service, min_instances=1),
             "min0": lambda: scale_service(service=service, min_instances=0)}
        )  # fmt: skip
    finally:
        runner.join()
    report = completed(promotion["state"])
    assert all(not isinstance(result, BaseException) for result in scales.values()), scales
    patches = [r for r in sb.requests("control", since=since) if r["method"] == "PATCH"]
    scaling = [r for r in patches if "updateMask=scaling" in r["query"]]
    assert scaling, "at least one of min 1 / min 0 changes the service"
    assert patches.index(scaling[0]) > max(i for i, r in enumerate(patches) if r not in scaling)  # never interleaved
    last_applied = json.loads(scaling[-1]["body"]).get("scaling", {}).get("minInstanceCount", 0)
    service_now = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")
    assert service_now.scaling.min_instance_count == last_applied
    assert (report.outcome, report.previous_revision) == ("promoted", first.serving_revision)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


def test_a_promotion_keeps_the_min_instances_scale_service_set(flow_env):
    service = unique("flt-keepmin")
    completed(promote(TINY, service))
    assert scale_service(service=service, min_instances=1).changed
    completed(promote(TINY, service, revision="dev"))
    service_now = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")
    assert service_now.scaling.min_instance_count == 1
