"""Fault injection (issue 8), the process running the flow: a promotion killed (SIGKILL) at ten points of its run,
and a first deploy killed before verification, each finished by a rerun.

The outcomes each test asserts, and the helpers: tests/support/faults.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.settings import PREFECT_API_URL

from flows.common import service_lock_name
from tasks.common import clients
from tasks.weights.staging import MANIFEST, commit_prefix
from tests.support.faults import (
    FAST,
    ROOT,
    TOKEN_BLOCK,
    assert_verified_against_hub,
    completed,
    completed_uploads,
    hub_files,
    new_repo,
    promote,
    traffic,
    unique,
)
from tests.support.locks import lock_slots, wait_until

# Ten killed promotions and their reruns: on a loaded 2-core machine this ran past the suite's 300 s default.
pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.timeout(1200)]


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


@pytest.mark.usefixtures("raised_quota")  # each rerun re-promotes the L4 service zero-downtime: not in 40 GiB
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
