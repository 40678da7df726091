"""Predefined IAM roles -> the permissions they grant, for the APIs the sandbox serves.

Source: Google's IAM roles and permissions reference, one page per service
(https://cloud.google.com/iam/docs/roles-permissions/run, .../storage, .../compute, .../iam, .../secretmanager,
.../artifactregistry, .../cloudbuild, .../logging, .../monitoring, .../serviceusage, .../resourcemanager, .../orgpolicy)
and the Cloud Run roles page (https://cloud.google.com/run/docs/reference/iam/roles: run.admin holds run.*;
run.developer everything but setIamPolicy). Only permissions on APIs the sandbox emulates are listed; a role's
permissions on other services (recommender.*, ...) are left out because nothing here checks them.

Entries are exact permissions or ``fnmatch`` patterns ("run.*", "*.get"). The basic roles (owner, editor,
viewer) are patterns with exceptions, as Google documents them: Editor cannot change IAM policies nor read secret
payloads; Viewer only reads, and not object data or secret payloads.
"""

from __future__ import annotations

import fnmatch
import functools

_PROJECT_READ = ("resourcemanager.projects.get", "resourcemanager.projects.list")
# artifactregistry.reader; artifactregistry.writer holds all of it, plus uploads and tag changes.
_ARTIFACT_READ = (
    "artifactregistry.repositories.get",
    "artifactregistry.repositories.list",
    "artifactregistry.repositories.downloadArtifacts",
    "artifactregistry.repositories.readViaVirtualRepository",
    "artifactregistry.dockerimages.get",
    "artifactregistry.dockerimages.list",
    "artifactregistry.files.get",
    "artifactregistry.files.list",
    "artifactregistry.packages.get",
    "artifactregistry.packages.list",
    "artifactregistry.tags.get",
    "artifactregistry.tags.list",
    "artifactregistry.versions.get",
    "artifactregistry.versions.list",
    "artifactregistry.locations.*",
    *_PROJECT_READ,
)
# What compute.networkAdmin and compute.networkViewer both hold besides networks and subnetworks.
_NETWORK_CONTEXT = (
    "compute.globalOperations.get",
    "compute.globalOperations.list",
    "compute.regionOperations.get",
    "compute.regionOperations.list",
    "compute.projects.get",
    "compute.regions.*",
    "compute.zones.*",
    *_PROJECT_READ,
)

ROLES: dict[str, tuple[str, ...]] = {
    # Basic roles ----------------------------------------------------------------------------------------------
    "roles/owner": ("*",),
    "roles/editor": ("*",),
    "roles/viewer": ("*.get", "*.list", "*.getIamPolicy", "storage.buckets.list", "iam.serviceAccounts.list"),
    # Cloud Run ------------------------------------------------------------------------------------------------
    "roles/run.admin": ("run.*", *_PROJECT_READ),
    "roles/run.developer": ("run.*", *_PROJECT_READ),  # minus setIamPolicy, see _EXCEPT
    "roles/run.viewer": ("run.*.get", "run.*.list", "run.*.getIamPolicy", *_PROJECT_READ),
    "roles/run.invoker": ("run.routes.invoke", "run.jobs.run", "run.jobs.runWithOverrides"),
    "roles/run.servicesInvoker": ("run.routes.invoke",),
    # IAM ------------------------------------------------------------------------------------------------------
    "roles/iam.serviceAccountUser": (
        "iam.serviceAccounts.actAs",
        "iam.serviceAccounts.get",
        "iam.serviceAccounts.list",
        *_PROJECT_READ,
    ),
    "roles/iam.serviceAccountAdmin": (
        "iam.serviceAccounts.create",
        "iam.serviceAccounts.delete",
        "iam.serviceAccounts.disable",
        "iam.serviceAccounts.enable",
        "iam.serviceAccounts.get",
        "iam.serviceAccounts.getIamPolicy",
        "iam.serviceAccounts.list",
        "iam.serviceAccounts.setIamPolicy",
        "iam.serviceAccounts.undelete",
        "iam.serviceAccounts.update",
        *_PROJECT_READ,
    ),
    "roles/iam.serviceAccountCreator": ("iam.serviceAccounts.create", *_PROJECT_READ),
    "roles/iam.securityReviewer": ("*.getIamPolicy", "iam.serviceAccounts.get", "iam.serviceAccounts.list"),
    # Cloud Storage --------------------------------------------------------------------------------------------
    "roles/storage.admin": ("storage.*", *_PROJECT_READ),
    "roles/storage.objectAdmin": ("storage.objects.*", "storage.multipartUploads.*", *_PROJECT_READ),
    "roles/storage.objectUser": (
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
        "storage.objects.restore",
        "storage.objects.update",
        "storage.multipartUploads.*",
        *_PROJECT_READ,
    ),
    "roles/storage.objectViewer": ("storage.objects.get", "storage.objects.list", *_PROJECT_READ),
    "roles/storage.objectCreator": ("storage.objects.create", "storage.multipartUploads.create", *_PROJECT_READ),
    # The legacy bucket roles every new bucket's policy binds to projectOwner/Editor/Viewer (convenience values).
    "roles/storage.legacyBucketOwner": (
        "storage.buckets.get",
        "storage.buckets.update",
        "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy",
        "storage.objects.list",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.multipartUploads.*",
    ),
    "roles/storage.legacyBucketWriter": (
        "storage.buckets.get",
        "storage.objects.list",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.multipartUploads.*",
    ),
    "roles/storage.legacyBucketReader": ("storage.buckets.get", "storage.objects.list"),
    "roles/storage.legacyObjectReader": ("storage.objects.get",),
    # Artifact Registry ----------------------------------------------------------------------------------------
    "roles/artifactregistry.admin": ("artifactregistry.*", *_PROJECT_READ),
    "roles/artifactregistry.repoAdmin": (
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.list",
        "artifactregistry.repositories.update",
        "artifactregistry.repositories.uploadArtifacts",
        "artifactregistry.repositories.downloadArtifacts",
        "artifactregistry.repositories.deleteArtifacts",
        "artifactregistry.repositories.readViaVirtualRepository",
        "artifactregistry.dockerimages.*",
        "artifactregistry.files.*",
        "artifactregistry.packages.*",
        "artifactregistry.tags.*",
        "artifactregistry.versions.*",
        "artifactregistry.locations.*",
        *_PROJECT_READ,
    ),
    "roles/artifactregistry.writer": (
        *_ARTIFACT_READ,
        "artifactregistry.repositories.uploadArtifacts",
        "artifactregistry.tags.create",
        "artifactregistry.tags.update",
    ),
    "roles/artifactregistry.reader": _ARTIFACT_READ,
    # Cloud Build ----------------------------------------------------------------------------------------------
    "roles/cloudbuild.builds.editor": (
        "cloudbuild.builds.create",
        "cloudbuild.builds.get",
        "cloudbuild.builds.list",
        "cloudbuild.builds.update",
        "cloudbuild.workerpools.use",
        *_PROJECT_READ,
    ),
    "roles/cloudbuild.builds.viewer": ("cloudbuild.builds.get", "cloudbuild.builds.list", *_PROJECT_READ),
    # What the legacy Cloud Build service account holds: it builds, pushes, reads and writes storage, writes logs.
    "roles/cloudbuild.builds.builder": (
        "cloudbuild.builds.create",
        "cloudbuild.builds.get",
        "cloudbuild.builds.list",
        "cloudbuild.builds.update",
        "cloudbuild.workerpools.use",
        "artifactregistry.dockerimages.*",
        "artifactregistry.files.*",
        "artifactregistry.packages.*",
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.list",
        "artifactregistry.repositories.uploadArtifacts",
        "artifactregistry.repositories.downloadArtifacts",
        "artifactregistry.repositories.createOnPush",
        "artifactregistry.tags.*",
        "artifactregistry.versions.*",
        "logging.logEntries.create",
        "storage.buckets.create",
        "storage.buckets.get",
        "storage.buckets.list",
        "storage.objects.*",
        *_PROJECT_READ,
    ),
    # Compute Engine (networking) ------------------------------------------------------------------------------
    "roles/compute.networkAdmin": (
        "compute.networks.*",
        "compute.subnetworks.*",
        *_NETWORK_CONTEXT,
    ),
    "roles/compute.networkViewer": (
        "compute.networks.get",
        "compute.networks.list",
        "compute.networks.getEffectiveFirewalls",
        "compute.subnetworks.get",
        "compute.subnetworks.list",
        *_NETWORK_CONTEXT,
    ),
    "roles/compute.networkUser": (
        "compute.networks.get",
        "compute.networks.list",
        "compute.networks.use",
        "compute.subnetworks.get",
        "compute.subnetworks.list",
        "compute.subnetworks.use",
        *_PROJECT_READ,
    ),
    # Secret Manager -------------------------------------------------------------------------------------------
    "roles/secretmanager.admin": ("secretmanager.*", *_PROJECT_READ),
    "roles/secretmanager.secretAccessor": ("secretmanager.versions.access",),
    "roles/secretmanager.viewer": (
        "secretmanager.secrets.get",
        "secretmanager.secrets.list",
        "secretmanager.secrets.getIamPolicy",
        "secretmanager.versions.get",
        "secretmanager.versions.list",
        "secretmanager.locations.*",
        *_PROJECT_READ,
    ),
    # Logging --------------------------------------------------------------------------------------------------
    "roles/logging.viewer": (
        "logging.logEntries.list",
        "logging.logs.list",
        "logging.*.get",
        "logging.*.list",
        *_PROJECT_READ,
    ),
    "roles/logging.logWriter": ("logging.logEntries.create", "logging.logEntries.route"),
    # Cloud Monitoring (https://cloud.google.com/iam/docs/roles-permissions/monitoring): reading time series is
    # monitoring.timeSeries.list, held by monitoring.viewer and the roles above it.
    "roles/monitoring.viewer": ("monitoring.*.get", "monitoring.*.list", *_PROJECT_READ),
    # Writing them is monitoring.timeSeries.create: the role a Cloud Run service account needs for the Managed
    # Service for Prometheus sidecar (run-gmp-sidecar README); these are its permissions on that reference page.
    "roles/monitoring.metricWriter": (
        "monitoring.metricDescriptors.create",
        "monitoring.metricDescriptors.get",
        "monitoring.metricDescriptors.list",
        "monitoring.monitoredResourceDescriptors.get",
        "monitoring.monitoredResourceDescriptors.list",
        "monitoring.timeSeries.create",
    ),
    "roles/monitoring.editor": ("monitoring.*", *_PROJECT_READ),
    "roles/monitoring.admin": ("monitoring.*", *_PROJECT_READ),
    # Service Usage, Resource Manager, Org Policy ---------------------------------------------------------------
    "roles/serviceusage.serviceUsageConsumer": (
        "serviceusage.services.use",
        "serviceusage.services.get",
        "serviceusage.services.list",
        "serviceusage.quotas.get",
    ),
    "roles/serviceusage.serviceUsageViewer": (
        "serviceusage.services.get",
        "serviceusage.services.list",
        "serviceusage.quotas.get",
        "serviceusage.operations.get",
        "serviceusage.operations.list",
        *_PROJECT_READ,
    ),
    "roles/serviceusage.serviceUsageAdmin": ("serviceusage.*", *_PROJECT_READ),
    "roles/resourcemanager.projectIamAdmin": (
        "resourcemanager.projects.get",
        "resourcemanager.projects.getIamPolicy",
        "resourcemanager.projects.setIamPolicy",
    ),
    "roles/browser": ("resourcemanager.projects.get", "resourcemanager.projects.list"),
    "roles/orgpolicy.policyViewer": (
        "orgpolicy.constraints.list",
        "orgpolicy.policies.list",
        "orgpolicy.policy.get",
        "orgpolicy.customConstraints.get",
        "orgpolicy.customConstraints.list",
    ),
    "roles/cloudquotas.viewer": ("cloudquotas.quotas.get", "cloudquotas.quotas.list", *_PROJECT_READ),
}

# Permissions a role's patterns would match but Google does not grant with it.
_EXCEPT: dict[str, tuple[str, ...]] = {
    # Editor: no IAM policy changes anywhere, no secret payloads (Secret Manager access-control docs).
    "roles/editor": ("*.setIamPolicy", "secretmanager.versions.access", "iam.serviceAccounts.setIamPolicy"),
    # Viewer: no object data, no secret payloads.
    "roles/viewer": ("storage.objects.get", "secretmanager.versions.access"),
    # run.developer = run.admin without setting IAM policies (Cloud Run IAM roles page).
    "roles/run.developer": ("run.*.setIamPolicy",),
}


def known(role: str) -> bool:
    """Whether the sandbox knows the role (a policy may still bind unknown or custom roles; they grant nothing)."""
    return role in ROLES


@functools.cache
def grants(role: str, permission: str) -> bool:
    """Whether ``role`` includes ``permission`` (IAM permission names compare case-insensitively here: Cloud Run
    spells actAs ``iam.serviceaccounts.actAs`` in its messages)."""
    permission = permission.lower()
    patterns = ROLES.get(role, ())
    if not any(fnmatch.fnmatchcase(permission, p.lower()) for p in patterns):
        return False
    return not any(fnmatch.fnmatchcase(permission, p.lower()) for p in _EXCEPT.get(role, ()))
