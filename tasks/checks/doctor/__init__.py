"""doctor: read-only checks of a real project before anything is spent, each with the command that fixes it.

Every call here is a read method: Service Usage ``services.batchGet`` and ``consumerQuotaMetrics.get``, Resource
Manager and IAM ``testIamPermissions``, Org Policy ``getEffectivePolicy``, Cloud Storage ``buckets.get``, Artifact
Registry ``tags.list``. A check that cannot read what it needs (an API that is itself disabled, a permission doctor
lacks) reports that as its result instead of raising, so one run shows everything that stands in the way.

The checks by area: ``access`` (the project, APIs, permissions, actAs, the metrics writer), ``capacity`` (the GPU in
the region, the regional quotas, Cloud Build's build region), ``policies`` (organisation policies), ``resources``
(subnet, bucket, build identity), ``prefect_api`` (the work pool's jobs and the Prefect API), ``worker_image``
(the work pool's image holds this tree), ``schedules`` (each model file's schedules, read from the Prefect API);
``rows`` holds what they share (a row, its fix, the grants, a failed read as a row).
flows/doctor.py runs them, each as its own task.
"""

from tasks.checks.doctor.access import (
    check_act_as,
    check_apis,
    check_doctor_permissions,
    check_metric_writer,
    check_permissions,
    check_project_access,
)
from tasks.checks.doctor.capacity import check_build_region, check_gpu_region, check_quotas
from tasks.checks.doctor.policies import check_org_policies, list_policy_allows, location_values
from tasks.checks.doctor.prefect_api import check_prefect_api
from tasks.checks.doctor.resources import check_bucket, check_build_identity, check_subnet
from tasks.checks.doctor.rows import (
    MAX_GOOGLE_TEXT,
    Check,
    DoctorFailed,
    google_text,
    grant_block,
    other_fixes,
    roles_to_grant,
)
from tasks.checks.doctor.worker_image import check_worker_image

__all__ = [
    "MAX_GOOGLE_TEXT",
    "Check",
    "DoctorFailed",
    "check_act_as",
    "check_apis",
    "check_bucket",
    "check_build_identity",
    "check_build_region",
    "check_doctor_permissions",
    "check_gpu_region",
    "check_metric_writer",
    "check_org_policies",
    "check_permissions",
    "check_prefect_api",
    "check_project_access",
    "check_quotas",
    "check_subnet",
    "check_worker_image",
    "google_text",
    "grant_block",
    "list_policy_allows",
    "location_values",
    "other_fixes",
    "roles_to_grant",
]
