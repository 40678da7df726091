"""The GCS stand-in (fake-gcs-server behind a thin front) through the real google-cloud-storage client."""

from __future__ import annotations

import itertools
import os
import sys

import httpx
import pytest
from google.api_core import exceptions

from sandbox.handle import SandboxHandle
from tasks.common import clients
from tests.support.locks import wait_until

_ids = itertools.count()


@pytest.fixture
def storage(sandbox_target):
    return clients.storage(sandbox_target)


def test_objects_round_trip_small_and_resumable(storage):
    bucket = storage.create_bucket(f"gcs-objects-{next(_ids)}", location="us-central1")
    small, large = os.urandom(1000), os.urandom(9 * 1024 * 1024)  # the second goes through a resumable upload
    bucket.blob("small").upload_from_string(small)
    bucket.blob("large", chunk_size=4 * 1024 * 1024).upload_from_string(large)
    assert bucket.blob("small").download_as_bytes() == small
    assert bucket.blob("large").download_as_bytes() == large
    assert bucket.get_blob("large").size == len(large)
    assert [b.name for b in storage.list_blobs(bucket, prefix="l")] == ["large"]


def test_bucket_location_and_access_settings_are_kept(storage):
    bucket = storage.bucket(f"gcs-settings-{next(_ids)}")
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.labels = {"team": "ml"}
    storage.create_bucket(bucket, location="europe-west4")
    fetched = storage.get_bucket(bucket.name)
    assert fetched.location == "EUROPE-WEST4"
    assert fetched.location_type == "region"
    assert fetched.iam_configuration.uniform_bucket_level_access_enabled is True
    assert fetched.iam_configuration.public_access_prevention == "enforced"
    assert fetched.labels == {"team": "ml"}
    plain = storage.create_bucket(f"gcs-plain-{next(_ids)}")
    assert (plain.location, plain.iam_configuration.public_access_prevention) == ("US", "inherited")


def test_patching_bucket_settings(storage):
    bucket = storage.create_bucket(f"gcs-patch-{next(_ids)}", location="us-central1")
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.labels = {"managed-by": "pipeline"}
    bucket.patch()
    fetched = storage.get_bucket(bucket.name)
    assert fetched.iam_configuration.public_access_prevention == "enforced"
    assert fetched.labels == {"managed-by": "pipeline"}


def test_bucket_iam_policy_read_modify_write_with_etag(storage):
    bucket = storage.create_bucket(f"gcs-iam-{next(_ids)}", location="us-central1")
    policy = bucket.get_iam_policy(requested_policy_version=3)
    stale = bucket.get_iam_policy(requested_policy_version=3)
    policy.bindings.append(
        {"role": "roles/storage.objectViewer", "members": {"serviceAccount:sa@p.iam.gserviceaccount.com"}}
    )
    bucket.set_iam_policy(policy)
    roles = {b["role"]: set(b["members"]) for b in bucket.get_iam_policy(requested_policy_version=3).bindings}
    assert roles["roles/storage.objectViewer"] == {"serviceAccount:sa@p.iam.gserviceaccount.com"}
    stale.bindings.append({"role": "roles/storage.admin", "members": {"user:x@example.com"}})
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.set_iam_policy(stale)


def test_faults_can_target_storage(sb, storage):
    sb.add_fault(
        "gcs",
        path="^/storage/v1/b/gcs-forbidden$",
        method="GET",
        status=403,
        body='{"error": {"code": 403, "message": "denied"}}',
    )
    with pytest.raises(exceptions.Forbidden):
        storage.get_bucket("gcs-forbidden")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_killed_sandbox_leaves_no_emulator_behind(tmp_path):
    # A sandbox its launcher had to SIGKILL (a stop that outlasted the wait) must not leave fake-gcs-server running:
    # each one holds its objects in RAM, and a suite that starts many sandboxes would pile them up.
    handle = SandboxHandle.start(tmp_path / "killed")
    emulator = handle.info["gcs_emulator_url"]
    assert httpx.get(f"{emulator}/storage/v1/b", timeout=10).status_code == 200
    handle.process.kill()
    handle.process.wait()
    handle.stop()

    def emulator_gone() -> bool:
        try:
            httpx.get(f"{emulator}/storage/v1/b", timeout=2)
        except httpx.TransportError:
            return True
        return False

    wait_until(emulator_gone, 60, "the emulator to exit with its sandbox")
