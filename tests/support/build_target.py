"""A target of its own for a test that builds images: its bucket, build bucket, Artifact Registry repository and the
build account's grants, made as the ensure-infrastructure step makes them."""

from __future__ import annotations

import itertools

from blocks import GcpTarget
from tasks.infra import build_identity, ensure

_ids = itertools.count()


def fresh_build_target(sandbox_target: GcpTarget, bucket_prefix: str, repository_prefix: str) -> GcpTarget:
    """``sandbox_target`` with a new bucket and repository (numbered within the test process), ready to build into."""
    n = next(_ids)
    fresh = sandbox_target.model_copy(
        update={"bucket": f"{bucket_prefix}-{n}", "artifact_repository": f"{repository_prefix}-{n}"}
    )
    ensure.ensure_bucket(fresh)
    ensure.ensure_build_bucket(fresh)
    ensure.ensure_artifact_registry(fresh)
    build_identity.ensure_build_identity(fresh)  # the ensure-infrastructure step's grants for builds
    return fresh
