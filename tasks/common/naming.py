"""The names the pipeline gives things on Google Cloud, shared by the steps that create, find and delete them."""

from __future__ import annotations

import re

from blocks.target import GcpTarget

# A Cloud Run service name: lowercase letters, digits and hyphens, starting with a letter (Cloud Run's own rule).
SERVICE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The tag a candidate revision is deployed under (its own URL, no traffic) ...
CANDIDATE_TAG = "candidate"
# ... and the tag the revision that served before keeps during the watch after a promotion.
PREVIOUS_TAG = "previous"


def repository_host(target: GcpTarget) -> str:
    """The Artifact Registry Docker repository the target's images are pushed to."""
    return f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}"


# Where each run's report is kept in the target's bucket, one folder per service: reports/<service>/ (written by
# tasks/report/archive.py; a teardown deletes a service's folder only when asked, tasks/infra/teardown.py).
REPORTS_PREFIX = "reports"
COMPILE_CACHE_PREFIX = "compile-cache"  # vLLM's compile caches in the model bucket (tasks/deploy/compile_cache.py)


def reports_prefix(service_id: str) -> str:
    """The folder of one service's reports in the target's bucket, e.g. ``reports/gemma-4-e2b/``."""
    return f"{REPORTS_PREFIX}/{service_id}/"


# The tag the serving revision gets while the quality gate asks it the candidate's questions (tasks/quality/gate.py):
# its own URL, its traffic unchanged. The next traffic write (a canary step, the promotion, or the abandon) drops it.
SERVING_TAG = "serving"
