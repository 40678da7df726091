"""Cloud Build's regional default-pool CPU quota, as Service Usage v1beta1 ``consumerQuotaMetrics`` answers it.

The metric is cloudbuild.googleapis.com/concurrent_public_pool_build_cpus, "Concurrent Build CPUs (Regional Default
Pool)" in Google's metrics list (https://cloud.google.com/monitoring/api/metrics_gcp, cloudbuild: its quota/.../limit
has labels limit_name and build_origin); Cloud Build's quotas page (https://cloud.google.com/build/quotas) gives it
5 - 100 CPUs per region, not adjustable. A project restricted to some regions (Cloud Build locations, "Restricted
regions for some projects") has it at 0 in the others: public write-ups of the FAILED_PRECONDITION "due to quota
restrictions, cannot run builds in this region" say the console's "Concurrent Build CPUs (Regional Public Pool) per
region per build_origin" quota is 0 there and ask Google for a value above 0. The limit's unit follows the other
per-build-origin Cloud Build CPU quotas (``gcloud alpha services quota update --unit='1/{project}/{region}/
{build_origin}'`` in public quota requests).

The sandbox answers a default bucket (every region) and a 0 bucket for each of ``SandboxConfig.
build_restricted_regions``; proto3 JSON leaves a zero limit out, as Google's answers do. Only the restriction is
enforced (sandbox/control/cloudbuild/api.py): the sandbox does not count build CPUs against the default figure.
"""

from __future__ import annotations

from urllib.parse import quote

SERVICE = "cloudbuild.googleapis.com"
METRIC = "cloudbuild.googleapis.com/concurrent_public_pool_build_cpus"
DISPLAY_NAME = "Concurrent Build CPUs (Regional Default Pool)"
UNIT = "1/{project}/{region}/{build_origin}"
LIMIT = "/project/region/build_origin"
# The top of the quotas page's 5 - 100, so that no build machine the sandbox runs (up to 32 vCPU) looks over it.
DEFAULT_CPUS = 100


def build_cpu_metric(project_number: str, restricted: list[str]) -> dict:
    """The metric as consumerQuotaMetrics.get answers it: the default bucket, then a 0 bucket per restricted region."""
    name = f"projects/{project_number}/services/{SERVICE}/consumerQuotaMetrics/{quote(METRIC, safe='')}"
    buckets: list[dict] = [{"effectiveLimit": str(DEFAULT_CPUS), "defaultLimit": str(DEFAULT_CPUS)}]
    buckets += [{"dimensions": {"region": region, "build_origin": "default"}} for region in sorted(restricted)]
    return {
        "name": name,
        "displayName": DISPLAY_NAME,
        "metric": METRIC,
        "unit": UNIT,
        "consumerQuotaLimits": [
            {
                "name": f"{name}/limits/{quote(LIMIT, safe='')}",
                "metric": METRIC,
                "unit": UNIT,
                "isPrecise": True,
                "quotaBuckets": buckets,
            }
        ],
    }
