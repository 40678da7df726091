"""Cloud Build's own access to Cloud Storage: source archives in, logs out.

It talks to the emulator directly (``ctx.gcs_emulator_url``), not through the sandbox's GCS front, as Google's
service reaches storage on its own path: faults a test injects on the ``gcs`` server hit the product's calls,
not the build service's.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx


class StorageError(Exception):
    """An unexpected answer from the emulator (not a plain 404)."""


class BuildStorage:
    """A small async client of the GCS JSON API for the Cloud Build stand-in."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(300, connect=10))

    @staticmethod
    def _object_path(bucket: str, name: str) -> str:
        return f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    async def bucket_exists(self, bucket: str) -> bool:
        response = await self.client.get(f"/storage/v1/b/{quote(bucket, safe='')}")
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise StorageError(f"GET bucket {bucket}: HTTP {response.status_code}")
        return True

    async def ensure_bucket(self, bucket: str, project: str) -> None:
        if await self.bucket_exists(bucket):
            return
        response = await self.client.post("/storage/v1/b", params={"project": project}, json={"name": bucket})
        if response.status_code not in (200, 409):
            raise StorageError(f"create bucket {bucket}: HTTP {response.status_code} {response.text[:200]}")

    async def object_generation(self, bucket: str, name: str, generation: int = 0) -> int | None:
        """The object's generation, or None when it (or that generation) does not exist."""
        params = {"generation": str(generation)} if generation else None
        response = await self.client.get(self._object_path(bucket, name), params=params)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise StorageError(f"GET gs://{bucket}/{name}: HTTP {response.status_code}")
        return int(response.json().get("generation") or 0)

    async def download(self, bucket: str, name: str, generation: int = 0) -> bytes | None:
        params = {"alt": "media"}
        if generation:
            params["generation"] = str(generation)
        response = await self.client.get(self._object_path(bucket, name), params=params)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise StorageError(f"download gs://{bucket}/{name}: HTTP {response.status_code}")
        return response.content

    async def upload_text(self, bucket: str, name: str, text: str) -> None:
        response = await self.client.post(
            f"/upload/storage/v1/b/{quote(bucket, safe='')}/o",
            params={"uploadType": "media", "name": name},
            content=text.encode(),
            headers={"content-type": "text/plain; charset=utf-8"},
        )
        if response.status_code >= 400:
            raise StorageError(f"upload gs://{bucket}/{name}: HTTP {response.status_code} {response.text[:200]}")

    async def aclose(self) -> None:
        await self.client.aclose()


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix`` (or ``bucket/prefix``) -> ("bucket", "some/prefix")."""
    bucket, _, prefix = url.removeprefix("gs://").strip("/").partition("/")
    return bucket, prefix.strip("/")
