"""Read-write Cloud Storage volumes: an object-prefix IAM condition, the revision's writable flag, the write-back.

Real clients over HTTP: google-cloud-storage for the bucket policy and for requests made as the service account (the
sandbox's caller set to it), run_v2 for the deploy; the launcher's write-back (volume_sync.VolumeSync) is driven
poll by poll against the sandbox's Cloud Storage, so nothing waits on a clock.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from blocks.target import GcpTarget
from sandbox.control.run.volume_sync import REFUSED_LINE, VolumeSync
from sandbox.serving import free_port
from sandbox.vllm.instance import InstanceEnv, Mount
from sandbox.vllm.real_engine import materialize
from sandbox.vllm.storage import emulator_client
from tasks.common import clients
from tasks.infra import ensure
from tests.support.models import let_read
from tests.support.services import gpu_service

BUCKET = "rw-volumes-weights"
CACHE = "compile-cache/"
_ids = itertools.count()
# The accounts and bindings are made with raw calls right before they are used, which have no product wait.
pytestmark = pytest.mark.usefixtures("grants_propagated", "iam_propagated")


@pytest.fixture
def target(sb, services, sandbox_target) -> Iterator[GcpTarget]:
    """A service account of the test's own; the services it deployed are deleted after it."""
    sb.run("POST", "/idle")
    yield sandbox_target.model_copy(update={"service_account_name": f"rw-sa-{next(_ids)}"})
    for service in services.list_services(parent=sandbox_target.location_path):
        if service.name.rsplit("/", 1)[1].startswith("rw-"):
            services.delete_service(name=service.name).result(polling=clients.operation_polling(sandbox_target))


@pytest.fixture
def act_as(sb) -> Iterator[Callable[[str], dict]]:
    """Make the sandbox's caller (who a credential-less client acts as) someone else; restored after the test."""
    before = sb.configure()["caller"]
    try:
        yield lambda principal: sb.configure(caller=principal)
    finally:
        sb.configure(caller=before)


def grant_cache(target: GcpTarget, member: str) -> None:
    """The serving account's conditional objectUser on the compile cache's folder, as the product grants it."""
    bucket = clients.storage(target).bucket(BUCKET)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    expression = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/{CACHE}")'
    condition = {"title": "compile-cache", "description": "vLLM's compile cache", "expression": expression}
    policy.bindings.append({"role": "roles/storage.objectUser", "members": {member}, "condition": condition})
    bucket.set_iam_policy(policy)


def test_an_object_prefix_condition_grants_its_role_on_objects_under_the_prefix_only(target, act_as):
    ensure.ensure_service_account(target)
    member = f"serviceAccount:{target.service_account_email}"
    let_read(clients.storage(target), BUCKET, [member])
    grant_cache(target, member)
    bucket = clients.storage(target).bucket(BUCKET)
    with pytest.raises(exceptions.BadRequest, match=r"Requested policy version \(1\) cannot be less than the existing"):
        bucket.get_iam_policy()  # no version asked: 1, which cannot show the condition
    conditional = [b for b in bucket.get_iam_policy(requested_policy_version=3).bindings if b.get("condition")]
    assert [b["role"] for b in conditional if member in b["members"]] == ["roles/storage.objectUser"]

    act_as(member)
    storage = clients.storage(target).bucket(BUCKET)
    storage.blob(f"{CACHE}key/small.bin").upload_from_string(b"multipart: the name is in the body's first part")
    resumable = storage.blob(f"{CACHE}key/large.bin", chunk_size=256 * 1024)
    resumable.upload_from_string(b"r" * (300 * 1024))  # resumable: the name is in the session's JSON
    assert storage.blob(f"{CACHE}key/small.bin").download_as_bytes().startswith(b"multipart")
    for name in ("models/outside.bin", "compile-cachex/near.bin"):
        with pytest.raises(exceptions.Forbidden) as refused:
            storage.blob(name).upload_from_string(b"no")
        email = target.service_account_email
        assert f"{email} does not have storage.objects.create access to the Google Cloud Storage object" in str(
            refused.value
        )
    # Listing is checked on the bucket, which a prefix condition never matches: the unconditional viewer role lists.
    assert {b.name for b in storage.list_blobs(prefix=CACHE)} >= {f"{CACHE}key/small.bin", f"{CACHE}key/large.bin"}


def test_the_revision_learns_which_read_write_volumes_its_account_may_write(sb, services, target):
    ensure.ensure_service_account(target)
    member = f"serviceAccount:{target.service_account_email}"
    let_read(clients.storage(target), BUCKET, [member])
    grant_cache(target, member)
    spec = gpu_service(BUCKET)
    spec.template.service_account = target.service_account_email
    for name, only_dir in (("compile-cache", f"{CACHE}key"), ("scratch", "scratch")):
        source = run_v2.GCSVolumeSource(bucket=BUCKET, read_only=False, mount_options=[f"only-dir={only_dir}"])
        spec.template.volumes.append(run_v2.Volume(name=name, gcs=source))
        spec.template.containers[0].volume_mounts.append(run_v2.VolumeMount(name=name, mount_path=f"/mnt/{name}"))
    service = services.create_service(parent=target.location_path, service=spec, service_id=f"rw-{next(_ids)}")
    revision = service.result(timeout=60, polling=clients.operation_polling(target)).latest_ready_revision
    instance = next(i for i in sb.run("GET", "/instances") if i["revision"] == revision)
    writable = {m["mount_path"]: m["writable"] for m in instance["mounts"]}
    # Read-only: never written. The cache's folder: granted. Another folder of the same bucket: viewer only.
    assert writable == {"/mnt/models": False, "/mnt/compile-cache": True, "/mnt/scratch": False}


def _volume(sb, tmp_path: Path, key: str, writable: bool) -> tuple[VolumeSync, Path]:
    """A read-write volume as the real engine's launcher sets it up: the objects copied, then its write-back."""
    mount = {"mount_path": "/mnt/compile-cache", "bucket": BUCKET, "only_dir": f"{CACHE}{key}", "read_only": False,
             "writable": writable}  # fmt: skip
    env = InstanceEnv(root=tmp_path, storage_emulator=sb.info["gcs_emulator_url"])
    copied = materialize(Mount(**mount), "/mnt/models/tiny", env)
    return VolumeSync(mount, tmp_path, sb.info["gcs_emulator_url"]), copied.source


def _objects(sb, key: str) -> dict[str, bytes]:
    bucket = emulator_client(sb.info["gcs_emulator_url"]).bucket(BUCKET)
    prefix = f"{CACHE}{key}/"
    return {b.name[len(prefix) :]: b.download_as_bytes() for b in bucket.list_blobs(prefix=prefix)}


def test_files_reach_the_bucket_once_they_stop_changing_and_at_the_final_sync(sb, tmp_path):
    key = f"sync-{next(_ids)}"
    bucket = emulator_client(sb.info["gcs_emulator_url"]).bucket(BUCKET)
    bucket.blob(f"{CACHE}{key}/earlier.bin").upload_from_string(b"from an earlier instance")
    generation = bucket.get_blob(f"{CACHE}{key}/earlier.bin").generation
    sync, folder = _volume(sb, tmp_path, key, writable=True)
    assert (folder / "earlier.bin").read_bytes() == b"from an earlier instance"  # the cache is there at start

    sync.poll()
    (folder / "inductor").mkdir()
    (folder / "inductor" / "done.py").write_text("compiled")
    (folder / "growing.bin").write_bytes(b"a" * 10)
    sync.poll()  # first seen
    with (folder / "growing.bin").open("ab") as growing:
        growing.write(b"b" * 10)  # still being written
    sync.poll()  # done.py unchanged since the last poll: closed, uploaded; growing.bin changed: not yet
    assert _objects(sb, key) == {"earlier.bin": b"from an earlier instance", "inductor/done.py": b"compiled"}
    assert bucket.get_blob(f"{CACHE}{key}/earlier.bin").generation == generation  # not sent back unchanged

    with (folder / "growing.bin").open("ab") as growing:
        growing.write(b"c" * 10)
    (folder / "last.bin").write_bytes(b"written just before the stop")
    sync.poll()
    sync.final()  # the instance stopped: whatever was not sent goes now, whole
    objects = _objects(sb, key)
    assert objects["growing.bin"] == b"a" * 10 + b"b" * 10 + b"c" * 10
    assert objects["last.bin"] == b"written just before the stop"
    assert sync.take_lines() == []


def test_without_write_access_nothing_reaches_the_bucket_and_each_file_is_logged_once(sb, tmp_path):
    key = f"refused-{next(_ids)}"
    sync, folder = _volume(sb, tmp_path, key, writable=False)
    sync.poll()
    (folder / "one.bin").write_bytes(b"1")
    (folder / "two.bin").write_bytes(b"2")
    sync.poll()
    sync.poll()
    (folder / "one.bin").write_bytes(b"1 again, longer")  # refused again: no second line for it
    sync.poll()
    sync.poll()
    sync.final()
    assert _objects(sb, key) == {}
    assert sync.take_lines() == [REFUSED_LINE, REFUSED_LINE]


FAKE_VLLM = """#!/bin/sh
# A stand-in for the engine venv's `vllm serve`: writes under each volume, as vLLM's compile cache would, and exits.
mkdir -p /mnt/compile-cache/vllm && echo compiled > /mnt/compile-cache/vllm/graph.bin && echo cache-written
touch /mnt/models/tiny/nope 2>/dev/null && echo models-writable || echo models-read-only
"""


def test_the_real_engine_gets_a_read_write_volume_read_write_and_the_rest_read_only(sb, services, tmp_path):
    """The real engine's launch (sandbox/vllm/real_engine.py) with a fake ``bin/vllm``: in its mount namespace the
    read-write volume takes writes, the model's stays read-only, and what it wrote is where the write-back reads."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text(FAKE_VLLM)
    (venv / "bin" / "vllm").chmod(0o755)
    key = f"engine-{next(_ids)}"
    mounts = [
        {"mount_path": "/mnt/models", "bucket": BUCKET, "only_dir": "models", "read_only": True},
        {"mount_path": "/mnt/compile-cache", "bucket": BUCKET, "only_dir": f"{CACHE}{key}", "read_only": False,
         "writable": True},
    ]  # fmt: skip
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "SANDBOX_IMAGE_ENTRYPOINT": "vllm-serve",
        "SANDBOX_ENGINE_VENV": str(venv),
        "SANDBOX_MOUNTS": json.dumps(mounts),
        "SANDBOX_ROOT": str(tmp_path / "root"),
        "SANDBOX_PORT_MAP": json.dumps({"8080": free_port()}),
        "STORAGE_EMULATOR_HOST": sb.info["gcs_emulator_url"],
    }
    ran = subprocess.run(
        [sys.executable, "-m", "sandbox.vllm", "/mnt/models/tiny", "--port", "8080", "--host", "0.0.0.0"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "cache-written" in ran.stdout and "models-read-only" in ran.stdout, ran.stdout + ran.stderr
    assert "volume at /mnt/compile-cache: 0 objects of" in ran.stdout + ran.stderr
    sync = VolumeSync(mounts[1], tmp_path / "root", sb.info["gcs_emulator_url"])
    sync.final()  # the engine exited: its stop's write-back
    assert _objects(sb, key) == {"vllm/graph.bin": b"compiled\n"}
