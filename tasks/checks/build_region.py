"""Cloud Build's regional restriction, read before anything is written: a ``build_region`` the project may not build
in is refused at preflight, not after the weights are staged.

Cloud Build restricts some projects, new ones among them, to a few regions (its locations page, "Restricted regions
for some projects": us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1) and
refuses a build created in another with 400 FAILED_PRECONDITION "failed precondition: due to quota restrictions,
cannot run builds in this region" (google-github-actions/deploy-cloudrun#480, europe-west2; GoogleCloudPlatform/
marketing-analytics-jumpstart PR 241: a new project's build failed in europe-west3 and ran in europe-west1). Such a
project shows it in Service Usage: the region's "Concurrent Build CPUs (Regional Default Pool)" quota
(cloudbuild.googleapis.com/concurrent_public_pool_build_cpus, Google's metrics list) is 0 there, and public
write-ups of the error ask Google to raise it above 0. The ``global`` location is not a region: Cloud Build's global
default pool has a quota of its own (concurrent builds, 10 - 30, cloud.google.com/build/quotas), so a target's
default ``build_region: global`` is never read here.
"""

from __future__ import annotations

import math
from urllib.parse import quote

from google.api_core import exceptions as gexc

from blocks.profile import ServingProfile
from blocks.target import GLOBAL, GcpTarget
from tasks.checks.quotas import effective_limit
from tasks.common import clients
from tasks.common.gcp import InfraError
from tasks.common.logs import run_logger
from tasks.image.builds import BUILD_CPU_METRIC, restricted_region


def read_build_cpus(target: GcpTarget):
    """Service Usage v1beta1 ``consumerQuotaMetrics.get`` of Cloud Build's regional default-pool CPU quota, as
    answered (doctor turns a refusal into its row)."""
    api = clients.quotas(target)
    path = f"projects/{target.project}/services/cloudbuild.googleapis.com/consumerQuotaMetrics/"
    return api.session.get(api.url(path + quote(BUILD_CPU_METRIC, safe="")))


def build_cpus(response_json: dict, region: str) -> float | None:
    """The region's default-pool CPU limit from the metric (math.inf: unlimited; None: no limit for the region)."""
    raw = effective_limit(response_json, region)
    if raw is None:
        return None
    return math.inf if raw == -1 else float(raw)


def builds(profile: ServingProfile) -> bool:
    """Whether a promotion of ``profile`` may run Cloud Build: a pinned image never does."""
    return profile.image is None and profile.build is not None


class BuildRegionRestricted(ValueError):
    """Cloud Build will not build in the target's build_region: refused before anything is written."""


def check_build_region(target: GcpTarget, profile: ServingProfile) -> None:
    """Refuse, before any write, a profile that builds in a ``build_region`` whose default-pool CPU quota is 0 (the
    build would be refused with FAILED_PRECONDITION after the infrastructure and the weights). A quota that cannot be
    read (no serviceusage.quotas.get, the API off) is logged and left to the build, whose refusal names the same fix
    (tasks/image/builds.restricted_region)."""
    if not builds(profile) or target.build_region == GLOBAL:
        return
    try:
        response = read_build_cpus(target)
        if response.status_code != 200:
            raise gexc.from_http_response(response)
        limit = build_cpus(response.json(), target.build_region)
    except (gexc.GoogleAPICallError, InfraError) as exc:
        run_logger().warning("%s could not be read for %s (%s); the build will tell", BUILD_CPU_METRIC,
                             target.build_region, exc)  # fmt: skip
        return
    if limit == 0:
        raise BuildRegionRestricted(f"build_region: {restricted_region(target)}")
