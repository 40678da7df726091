"""Reading what a promotion left in the Prefect API, as the UI shows it."""

from __future__ import annotations

import asyncio

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort


def artifact(key: str) -> str:
    """The data of the newest artifact with ``key`` ("" when there is none)."""

    async def read() -> str:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
            )
        return found[0].data if found else ""

    return asyncio.run(read())


def report_artifact(service: str) -> str:
    """The markdown of the newest promotion report artifact of ``service`` ("" when there is none)."""
    return artifact(f"promotion-{service}")
