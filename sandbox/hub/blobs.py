"""File contents of the Hub stand-in: small bytes, deterministic synthetic weights, files on disk.

Every blob answers any byte range without holding a big file in memory, so the Hub and CDN can serve Range
requests and a benchmark can publish multi-GiB models while the sandbox process stays small.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

POOL_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20


class Blob(Protocol):
    """Immutable content addressed by byte offsets."""

    @property
    def size(self) -> int: ...

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``, clamped to the blob."""
        ...


@dataclass(frozen=True)
class BytesBlob:
    """Content held in memory: config files, tokenizers, anything small."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, start: int, end: int) -> bytes:
        return self.data[start:end]


@lru_cache(maxsize=32)
def random_pool(seed: int) -> bytes:
    """``POOL_BYTES`` seeded random bytes, stored twice so any pool-sized window is one slice."""
    data = random.Random(seed).randbytes(POOL_BYTES)
    return data + data


@dataclass(frozen=True)
class SyntheticBlob:
    """A prefix (e.g. a safetensors header) followed by ``body_size`` bytes of a rotated random pool.

    Byte ``i`` of the body is ``pool[(offset + i) % POOL_BYTES]``: every range is computed by slicing, so a 4 GiB
    shard costs 2 MiB of memory per seed, and a per-file ``offset`` keeps files of one model distinct.
    """

    prefix: bytes
    body_size: int
    seed: int = 0
    offset: int = 0

    @property
    def size(self) -> int:
        return len(self.prefix) + self.body_size

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        parts: list[bytes] = []
        head = len(self.prefix)
        if start < head:
            parts.append(self.prefix[start : min(end, head)])
            start = head
        pool = random_pool(self.seed)
        while start < end:
            at = (self.offset + start - head) % POOL_BYTES
            count = min(end - start, POOL_BYTES)
            parts.append(pool[at : at + count])
            start += count
        return b"".join(parts)

    def update_hash(self, digest: hashlib._Hash) -> None:
        """Feed the whole content to ``digest`` without copying pool windows."""
        digest.update(self.prefix)
        view = memoryview(random_pool(self.seed))
        done = 0
        while done < self.body_size:
            at = (self.offset + done) % POOL_BYTES
            count = min(self.body_size - done, POOL_BYTES)
            digest.update(view[at : at + count])
            done += count


@dataclass(frozen=True)
class FileBlob:
    """A file on local disk, read on demand (``repo_from_folder``). It must not change while served."""

    path: Path
    size: int

    blocking = True  # reads touch the disk: servers should run them off the event loop

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        with self.path.open("rb") as handle:
            handle.seek(start)
            return handle.read(end - start)


def iter_chunks(blob: Blob, start: int, end: int, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """``blob[start:end]`` in pieces of at most ``chunk`` bytes."""
    while start < end:
        stop = min(end, start + chunk)
        yield blob.read(start, stop)
        start = stop


def blob_sha256(blob: Blob) -> str:
    """The sha256 of the whole blob, hashed in chunks (LFS object ids)."""
    digest = hashlib.sha256()
    if isinstance(blob, SyntheticBlob):
        blob.update_hash(digest)
    elif isinstance(blob, FileBlob):
        with blob.path.open("rb") as handle:
            for piece in iter(lambda: handle.read(CHUNK_BYTES), b""):
                digest.update(piece)
    else:
        for piece in iter_chunks(blob, 0, blob.size):
            digest.update(piece)
    return digest.hexdigest()


def git_blob_oid(data: bytes) -> str:
    """The id git gives a blob: sha1 over ``"blob {size}\\0"`` and the content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file that git stores in place of a large file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
