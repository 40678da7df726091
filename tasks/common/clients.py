"""The one place that builds cloud clients: Google APIs from a GcpTarget, the Hub from a ModelSource.

Real endpoints and Application Default Credentials (or the target's GcpCredentials block) normally; the
target's endpoints and anonymous credentials when it points at local stand-ins. Every Google client uses
the REST transport, so the same code reaches GCP or the offline sandbox (FACTS.md: an http:// endpoint
needs REST; gRPC cannot use it). No other module chooses endpoints or credentials.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import google.auth
import google.auth.exceptions
from google.api_core.client_options import ClientOptions
from google.api_core.future import polling
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from pydantic import SecretStr

from blocks.source import ModelSource
from blocks.target import GcpTarget

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
IAM_DEFAULT_ENDPOINT = "https://iam.googleapis.com"
LOGGING_DEFAULT_ENDPOINT = "https://logging.googleapis.com"
MONITORING_DEFAULT_ENDPOINT = "https://monitoring.googleapis.com"
SERVICEUSAGE_DEFAULT_ENDPOINT = "https://serviceusage.googleapis.com"
HUB_DEFAULT_ENDPOINT = "https://huggingface.co"


def credentials(target: GcpTarget) -> Credentials:
    """Credentials for ``target``: anonymous for stand-ins, the GcpCredentials block, else ADC."""
    if target.anonymous_credentials:
        return AnonymousCredentials()
    if target.gcp_credentials is not None and (
        target.gcp_credentials.service_account_file or target.gcp_credentials.service_account_info
    ):
        return target.gcp_credentials.get_credentials_from_service_account()
    found, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return found


def principal(target: GcpTarget) -> str | None:
    """The IAM member the target's calls act as, when its credentials say so without a call: a service-account key's
    account (the GcpCredentials block). None for ADC and anonymous credentials (who they are takes a request)."""
    block = target.gcp_credentials
    if block is None or target.anonymous_credentials:
        return None
    info = block.service_account_info.get_secret_value() if block.service_account_info else None
    if info is None and block.service_account_file:
        try:
            info = json.loads(Path(block.service_account_file).expanduser().read_text())
        except (OSError, ValueError):
            return None
    email = (info or {}).get("client_email")
    return f"serviceAccount:{email}" if email else None


def client_options(target: GcpTarget, api: str) -> ClientOptions | None:
    endpoint = target.endpoint(api)
    return ClientOptions(api_endpoint=endpoint) if endpoint else None


def _rest_client(cls, target: GcpTarget, api: str):
    return cls(transport="rest", credentials=credentials(target), client_options=client_options(target, api))


def run_services(target: GcpTarget):
    """Cloud Run Admin API v2: services."""
    from google.cloud import run_v2

    return _rest_client(run_v2.ServicesClient, target, "run")


def run_revisions(target: GcpTarget):
    """Cloud Run Admin API v2: revisions."""
    from google.cloud import run_v2

    return _rest_client(run_v2.RevisionsClient, target, "run")


def run_jobs(target: GcpTarget):
    """Cloud Run Admin API v2: jobs."""
    from google.cloud import run_v2

    return _rest_client(run_v2.JobsClient, target, "run")


def run_executions(target: GcpTarget):
    """Cloud Run Admin API v2: job executions."""
    from google.cloud import run_v2

    return _rest_client(run_v2.ExecutionsClient, target, "run")


def cloud_build(target: GcpTarget):
    """Cloud Build API v1."""
    from google.cloud.devtools import cloudbuild_v1

    return _rest_client(cloudbuild_v1.CloudBuildClient, target, "cloudbuild")


def compute_networks(target: GcpTarget):
    from google.cloud import compute_v1

    return _rest_client(compute_v1.NetworksClient, target, "compute")


def compute_subnetworks(target: GcpTarget):
    from google.cloud import compute_v1

    return _rest_client(compute_v1.SubnetworksClient, target, "compute")


def compute_global_operations(target: GcpTarget):
    """Waits on network operations through the SAME endpoint as the call (FACTS.md: ``result()`` would not)."""
    from google.cloud import compute_v1

    return _rest_client(compute_v1.GlobalOperationsClient, target, "compute")


def compute_region_operations(target: GcpTarget):
    from google.cloud import compute_v1

    return _rest_client(compute_v1.RegionOperationsClient, target, "compute")


def secret_manager(target: GcpTarget):
    from google.cloud import secretmanager_v1

    return _rest_client(secretmanager_v1.SecretManagerServiceClient, target, "secretmanager")


def artifact_registry(target: GcpTarget):
    from google.cloud import artifactregistry_v1

    return _rest_client(artifactregistry_v1.ArtifactRegistryClient, target, "artifactregistry")


def storage(target: GcpTarget):
    """Cloud Storage JSON API client for the target's project."""
    from google.cloud import storage as gcs

    options = {"api_endpoint": target.endpoint("storage")} if target.endpoint("storage") else None
    return gcs.Client(project=target.project, credentials=credentials(target), client_options=options)


@dataclass(frozen=True)
class GoogleRest:
    """A Google REST API called without a client library: an authorized session, the endpoint and the version.

    Used where no google-cloud-* library has a REST transport (IAM admin, FACTS.md) or covers the version (Service
    Usage v1beta1), or where one method does not warrant one (Cloud Logging ``entries.list``).
    """

    session: AuthorizedSession
    base_url: str
    version: str

    def url(self, path: str) -> str:
        return f"{self.base_url}/{self.version}/{path.lstrip('/')}"


def _google_rest(target: GcpTarget, api: str, default_endpoint: str, version: str) -> GoogleRest:
    return GoogleRest(AuthorizedSession(credentials(target)), target.endpoint(api) or default_endpoint, version)


def iam(target: GcpTarget) -> GoogleRest:
    """The IAM REST API v1 (service accounts): iam_admin_v1 has no REST transport (FACTS.md)."""
    return _google_rest(target, "iam", IAM_DEFAULT_ENDPOINT, "v1")


def logging_api(target: GcpTarget) -> GoogleRest:
    """Cloud Logging API v2 (revision logs): reading entries needs one method, not google-cloud-logging."""
    return _google_rest(target, "logging", LOGGING_DEFAULT_ENDPOINT, "v2")


def monitoring(target: GcpTarget) -> GoogleRest:
    """Cloud Monitoring API v3 (``timeSeries.list``): google-cloud-monitoring 2.32.0 ships gRPC transports only,
    and the product's clients are REST throughout (one endpoint per API in GcpTarget.endpoints)."""
    return _google_rest(target, "monitoring", MONITORING_DEFAULT_ENDPOINT, "v3")


def service_usage(target: GcpTarget):
    """Service Usage API v1: which APIs the project has enabled (doctor)."""
    from google.cloud import service_usage_v1

    return _rest_client(service_usage_v1.ServiceUsageClient, target, "serviceusage")


def projects(target: GcpTarget):
    """Cloud Resource Manager API v3: projects (testIamPermissions for doctor)."""
    from google.cloud import resourcemanager_v3

    return _rest_client(resourcemanager_v3.ProjectsClient, target, "cloudresourcemanager")


def org_policy(target: GcpTarget):
    """Organization Policy API v2: effective policies on the project (doctor)."""
    from google.cloud import orgpolicy_v2

    return _rest_client(orgpolicy_v2.OrgPolicyClient, target, "orgpolicy")


def quotas(target: GcpTarget) -> GoogleRest:
    """Service Usage API v1beta1 consumer quota metrics (Cloud Run GPU quota): no google-cloud-* library covers
    v1beta1, and the Cloud Quotas API client is not needed for one read."""
    return _google_rest(target, "serviceusage", SERVICEUSAGE_DEFAULT_ENDPOINT, "v1beta1")


def operation_polling(target: GcpTarget):
    """Polling policy for long-running operations: the client default unless the target sets an interval."""
    if target.operation_poll_seconds is None:
        return polling.DEFAULT_POLLING
    return polling.DEFAULT_POLLING.with_delay(
        initial=target.operation_poll_seconds, maximum=target.operation_poll_seconds, multiplier=1.0
    )


def identity_token(target: GcpTarget, audience: str) -> SecretStr:
    """A Google-signed ID token whose ``aud`` is ``audience``, for calling a private Cloud Run service (lesson 21).

    Cloud Run accepts only the service's own run.app URLs (or its custom audiences) as audience, not a tag URL:
    pass the service URL, also when calling a tag URL. The target's service-account key (info or file) mints one
    through its token endpoint; otherwise google-auth's ``fetch_id_token`` uses GOOGLE_APPLICATION_CREDENTIALS,
    then the metadata server (a Cloud Run worker or VM; the offline sandbox serves one too); impersonated ADC asks
    IAM Credentials; user credentials carry one after a refresh (its ``aud`` is gcloud's client id, which Cloud
    Run also accepts).
    """
    import google.auth.transport.requests
    import google.oauth2.id_token
    from google.auth import impersonated_credentials
    from google.oauth2 import service_account

    request = google.auth.transport.requests.Request()
    block = target.gcp_credentials
    if block is not None and (block.service_account_info or block.service_account_file):
        key = service_account.IDTokenCredentials
        creds = (
            key.from_service_account_info(block.service_account_info.get_secret_value(), target_audience=audience)
            if block.service_account_info
            else key.from_service_account_file(str(block.service_account_file), target_audience=audience)
        )
        creds.refresh(request)
        return SecretStr(creds.token)
    try:
        return SecretStr(google.oauth2.id_token.fetch_id_token(request, audience))
    except google.auth.exceptions.DefaultCredentialsError:
        user = credentials(target)
        if isinstance(user, AnonymousCredentials):
            raise  # nothing that could sign for us: no key, no metadata server
        if isinstance(user, impersonated_credentials.Credentials):
            # ADC from `gcloud auth application-default login --impersonate-service-account=SA`: IAM Credentials'
            # generateIdToken mints it as SA, with the email claim Cloud Run's invoker check reads.
            minted = impersonated_credentials.IDTokenCredentials(user, target_audience=audience, include_email=True)
            minted.refresh(request)
            return SecretStr(minted.token)
        user.refresh(request)
        token = getattr(user, "id_token", None)
        if not token:
            raise
        return SecretStr(token)


@dataclass(frozen=True)
class HubAccess:
    """How to reach the Hugging Face Hub for one model source."""

    endpoint: str
    token: SecretStr | None
    # Where ``endpoint`` came from, for messages that must tell a user what to change when it cannot be reached.
    endpoint_origin: str = "huggingface_hub's default"

    def api(self):
        """A huggingface_hub HfApi bound to this endpoint and token."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token.get_secret_value() if self.token else False)


def hub_token(source: ModelSource, secret_block: str | None = None) -> SecretStr | None:
    """The Hub token: the named Prefect Secret block (parameter, then source), else HF_TOKEN, else none."""
    name = secret_block or source.token_secret_block
    if name:
        from prefect.blocks.system import Secret

        try:
            value = Secret.load(name).get()
        except ValueError:
            raise ValueError(
                f"token_secret_block: no Prefect Secret block named '{name}'; create it with `prefect block create "
                "secret` (value: your Hub token), or leave token_secret_block empty to use HF_TOKEN"
            ) from None
        return SecretStr(str(value))
    env = os.environ.get("HF_TOKEN")
    return SecretStr(env) if env else None


def hub(source: ModelSource, token: SecretStr | None) -> HubAccess:
    """The source's Hub endpoint, else HF_ENDPOINT (huggingface_hub's own setting), else huggingface.co."""
    if source.hub_endpoint:
        return HubAccess(source.hub_endpoint, token, "the model source's hub_endpoint")
    if os.environ.get("HF_ENDPOINT"):
        return HubAccess(os.environ["HF_ENDPOINT"], token, "the HF_ENDPOINT environment variable")
    return HubAccess(HUB_DEFAULT_ENDPOINT, token)
