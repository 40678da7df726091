"""Where a model directory's files live: the container's disk, or Cloud Storage (a FUSE volume or gs://).

Both give vLLM the same view: the files directly in the directory with their sizes, whole small files
(config.json, index files), and the first bytes of a weight file. Weights are never read in full: the
safetensors header says what the rest must hold, and the size check catches truncation.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandbox.vllm.errors import VllmStartupError

if TYPE_CHECKING:
    from google.cloud import storage
    from google.cloud.storage import Bucket

# One ranged read usually covers the header: real shards have headers of a few KiB to a few MiB.
HEAD_BYTES = 256 * 1024


class ModelDir(Protocol):
    """A directory of model files, as vLLM sees it inside the container."""

    path: str

    def exists(self) -> bool:
        """Whether the directory exists (for Cloud Storage: any object under it)."""
        ...

    def files(self) -> dict[str, int]:
        """Names and sizes of the files directly in the directory."""
        ...

    def read(self, name: str) -> bytes:
        """The whole content of a small file."""
        ...

    def read_head(self, name: str, size: int, length: int) -> bytes:
        """The first ``length`` bytes (fewer if the file, ``size`` bytes long, is shorter)."""
        ...


def emulator_client(emulator_url: str) -> storage.Client:
    """A Cloud Storage client on the GCS emulator, as the platform's storage access looks from a container."""
    # google-cloud-storage costs half a second of imports: only instances that read GCS pay it.
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="sandbox-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator_url}
    )


class LocalDir:
    """A directory on the container's own filesystem (``SANDBOX_ROOT`` stands for ``/``)."""

    def __init__(self, path: str, host_path: Path) -> None:
        self.path = path
        self.host_path = host_path

    def exists(self) -> bool:
        """Whether the directory exists on the instance's root filesystem."""
        return self.host_path.is_dir()

    def files(self) -> dict[str, int]:
        """Regular files directly in the directory, following symlinks like vLLM's glob does."""
        return {p.name: p.stat().st_size for p in self.host_path.iterdir() if p.is_file()}

    def read(self, name: str) -> bytes:
        """The file's bytes."""
        return (self.host_path / name).read_bytes()

    def read_head(self, name: str, size: int, length: int) -> bytes:
        """The file's first bytes."""
        with (self.host_path / name).open("rb") as handle:
            return handle.read(min(length, size))


class GcsDir:
    """Objects under a prefix in a bucket of the GCS emulator, seen as a directory (implicit dirs, as gcsfuse).

    ``path`` is what vLLM was given (``/mnt/models/x`` on a volume, ``gs://b/x`` when streaming).
    """

    def __init__(self, path: str, bucket: str, prefix: str, emulator_url: str | None) -> None:
        self.path = path
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._emulator_url = emulator_url
        self._bucket: Bucket | None = None
        self._listing: dict[str, int] | None = None
        self._any_object = False

    def _client_bucket(self) -> Bucket:
        if self._bucket is None:
            if not self._emulator_url:
                raise VllmStartupError(
                    "RuntimeError",
                    f"[sandbox] STORAGE_EMULATOR_HOST is not set: cannot read gs://{self.bucket_name}",
                )
            self._bucket = emulator_client(self._emulator_url).bucket(self.bucket_name)
        return self._bucket

    def _list(self) -> dict[str, int]:
        if self._listing is None:
            from google.api_core import exceptions

            bucket = self._client_bucket()
            start = f"{self.prefix}/" if self.prefix else ""
            listing: dict[str, int] = {}
            try:
                for blob in bucket.client.list_blobs(bucket, prefix=start or None):
                    self._any_object = True
                    rest = blob.name[len(start) :]
                    if rest and "/" not in rest:
                        listing[rest] = int(blob.size or 0)
            except exceptions.NotFound:
                raise VllmStartupError(
                    "RuntimeError",
                    f"Cloud Storage bucket {self.bucket_name!r} does not exist (reading {self.path})",
                ) from None
            self._listing = listing
        return self._listing

    def exists(self) -> bool:
        """A prefix "directory" exists when an object lies under it; the bucket root always exists."""
        self._list()
        return self._any_object or not self.prefix

    def files(self) -> dict[str, int]:
        """Objects directly under the prefix."""
        return dict(self._list())

    def _object(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def read(self, name: str) -> bytes:
        """A whole (small) object."""
        return self._client_bucket().blob(self._object(name)).download_as_bytes(checksum=None)

    def read_head(self, name: str, size: int, length: int) -> bytes:
        """A ranged read of the object's first bytes."""
        if size <= 0:
            return b""
        end = min(length, size) - 1
        blob = self._client_bucket().blob(self._object(name))
        return blob.download_as_bytes(start=0, end=end, checksum=None)
