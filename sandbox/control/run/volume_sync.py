"""Write-back of a read-write Cloud Storage volume: what the real engine writes under it reaches the bucket.

On Cloud Run a Cloud Storage volume is a Cloud Storage FUSE (gcsfuse) mount, and a file written to it becomes an
object when it is closed or flushed, not while it is written: "When writing to Cloud Storage, the entire file is
staged in Cloud Run memory before the file is written to Cloud Storage" (Cloud Run docs, "Configure Cloud Storage
volume mounts"); for new objects, "Upon closing or fsyncing the file, the file is then written to your Cloud Storage
bucket" (GoogleCloudPlatform/gcsfuse docs/semantics.md, "Writes"; from v3.0 streaming writes upload while the file is
written, and the object still appears, finalized, only at close). Writing needs the mount's account to hold
storage.objects.create there; without it the write fails with a 403 from Cloud Storage.

The real engine (sandbox/vllm/real_engine.py) sees the volume as a host folder the launcher can read. The sandbox
cannot see a close, so it takes a file that stopped changing as closed: every ``POLL_S`` seconds the launcher looks
at the folder, and a file whose size and mtime were the same at two polls in a row is uploaded to
``gs://BUCKET/<only_dir>/<relative path>``, once per version (a file still being written changes between polls and
waits). Files that came from the bucket at start (the baseline real_engine writes beside the copy) are not sent back
unless changed. When the instance stops (SIGTERM, scale to zero, revision deleted) a final pass uploads every file
not yet sent, whatever its age: nothing writes any more.

A volume whose account may not create objects there (``writable`` false: judged by the control plane at start,
dependencies.may_write) is written to as freely, but nothing reaches the bucket: each file the engine writes gets
one line in the instance's log, gcsfuse's own for a write refused with 403, and is never uploaded. The line is the
one gcsfuse logged for it (GoogleCloudPlatform/gcs-fuse-csi-driver issue 142, the sidecar's log when writing to a
bucket the account could only read): it names neither the file nor the account, as there.

Deleting or renaming a file is not written back (gcsfuse deletes or copies the object; nothing here needs it yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

from sandbox.vllm.real_engine import baseline_path, materialized_source
from sandbox.vllm.storage import emulator_client

POLL_S = 2.0  # real seconds between two looks at the folder
REFUSED_LINE = (
    "CreateFile: permission denied, CreateChildFile: error in closing writer : googleapi: Error 403: Access denied., "
    "forbidden"
)

State = tuple[int, int]  # (size, mtime_ns)


class VolumeSync:
    """One read-write volume of one instance: its host folder, and what of it the bucket already has."""

    def __init__(self, mount: dict, root: Path, gcs_url: str) -> None:
        self.bucket: str = mount["bucket"]
        self.only_dir = (mount.get("only_dir") or "").strip("/")
        self.writable = bool(mount.get("writable"))
        self.source = materialized_source(root, mount["mount_path"])
        self.gcs_url = gcs_url
        self._sent: dict[str, State] | None = None  # None until the engine's copy of the bucket is complete
        self._seen: dict[str, State] = {}  # what the previous poll saw of each file
        self._refused: set[str] = set()
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._client = None

    def object_name(self, relative: str) -> str:
        """The object a file at ``relative`` (under the mount path) is written to."""
        return f"{self.only_dir}/{relative}" if self.only_dir else relative

    def poll(self) -> None:
        """Upload the files that did not change since the previous poll (blocking)."""
        with self._lock:
            if not self._started():
                return
            now = self._scan()
            for relative, state in now.items():
                if self._sent.get(relative) != state and self._seen.get(relative) == state:
                    self._write(relative, state)
            self._seen = now

    def final(self) -> None:
        """Upload every file not sent yet: the instance has stopped, nothing writes any more (blocking)."""
        with self._lock:
            if not self._started():
                return
            for relative, state in self._scan().items():
                if self._sent.get(relative) != state:
                    self._write(relative, state)

    def take_lines(self) -> list[str]:
        """The log lines the uploads gave since the last call (kept until taken, so none is lost to a cancel)."""
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    async def run(self, log: Callable[[str], None], poll_s: float = POLL_S) -> None:
        """Poll until cancelled, logging on the event loop what each poll gives."""
        while True:
            await asyncio.sleep(poll_s)
            await asyncio.to_thread(self.poll)
            for line in self.take_lines():
                log(line)

    def _started(self) -> bool:
        if self._sent is None:
            try:
                baseline = json.loads(baseline_path(self.source).read_text())
            except (FileNotFoundError, ValueError):
                return False  # the engine is still copying the bucket (or never got that far)
            self._sent = {relative: (size, mtime) for relative, (size, mtime) in baseline.items()}
        return True

    def _scan(self) -> dict[str, State]:
        files: dict[str, State] = {}
        if not self.source.is_dir():
            return files
        for path in self.source.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # removed between listing and stat
                if path.is_file():
                    stat = path.stat()
                    files[path.relative_to(self.source).as_posix()] = (stat.st_size, stat.st_mtime_ns)
        return files

    def _write(self, relative: str, state: State) -> None:
        assert self._sent is not None
        self._sent[relative] = state
        if not self.writable:
            if relative not in self._refused:
                self._refused.add(relative)
                self._lines.append(REFUSED_LINE)
            return
        if self._client is None:
            self._client = emulator_client(self.gcs_url)
        blob = self._client.bucket(self.bucket).blob(self.object_name(relative))
        try:
            blob.upload_from_filename(str(self.source / relative), checksum=None)
        except FileNotFoundError:
            del self._sent[relative]  # gone before it could be read: nothing to write


def volume_syncs(mounts: list[dict], root: Path, gcs_url: str) -> list[VolumeSync]:
    """The write-backs an instance's read-write volumes need (none for read-only ones)."""
    return [VolumeSync(mount, root, gcs_url) for mount in mounts if not mount.get("read_only", True)]
