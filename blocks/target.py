"""Where models are served: a GCP project and region, the names of what we create there, and how to reach it."""

from __future__ import annotations

import ipaddress
import re
from typing import ClassVar

from prefect.blocks.core import Block
from prefect_gcp import GcpCredentials
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
PRINCIPAL = re.compile(r"^(user|serviceAccount|group|domain|principal|principalSet):\S+$")
ENDPOINT = re.compile(r"^https?://[^/\s]+/?$")
GLOBAL = "global"  # the one Cloud Build location that is not a region


class ApiEndpoints(BaseModel):
    """Base URLs of Google APIs, for a target that is an emulator or the offline sandbox.

    Unset fields use Google's public endpoints. A URL must carry its scheme: the REST clients go to https
    when it is missing (FACTS.md).
    """

    model_config = ConfigDict(extra="forbid")

    run: str | None = Field(None, description="Cloud Run Admin API v2, e.g. http://127.0.0.1:8123")
    cloudbuild: str | None = Field(None, description="Cloud Build API v1")
    compute: str | None = Field(None, description="Compute Engine API v1 (networks, subnetworks)")
    iam: str | None = Field(None, description="IAM API v1 (service accounts)")
    secretmanager: str | None = Field(None, description="Secret Manager API v1")
    artifactregistry: str | None = Field(None, description="Artifact Registry API v1")
    logging: str | None = Field(None, description="Cloud Logging API v2 (revision logs)")
    monitoring: str | None = Field(None, description="Cloud Monitoring API v3 (watching a promotion's metrics)")
    storage: str | None = Field(None, description="Cloud Storage JSON API (e.g. a fake-gcs-server URL)")
    serviceusage: str | None = Field(None, description="Service Usage API (doctor: enabled APIs, GPU quota)")
    cloudresourcemanager: str | None = Field(
        None, description="Cloud Resource Manager API v3 (doctor: the caller's permissions on the project)"
    )
    orgpolicy: str | None = Field(None, description="Organization Policy API v2 (doctor: effective policies)")

    @field_validator("*")
    @classmethod
    def _has_scheme(cls, value: str | None, info) -> str | None:
        if value is not None and not ENDPOINT.match(value):
            raise ValueError(
                f"endpoint '{value}' must be a base URL with its scheme and no path, such as "
                f"'http://127.0.0.1:8123' or 'https://{info.field_name}.googleapis.com'"
            )
        return value.rstrip("/") if value else value


class GcpTarget(Block):
    """A GCP project and region to serve models in, and the names of the resources the pipeline manages there.

    Real projects use Application Default Credentials, or the prefect-gcp GcpCredentials block referenced
    here. Pointing ``endpoints`` at local stand-ins with ``anonymous_credentials`` makes the same flows run
    against the offline sandbox; nothing else in the product changes.
    """

    _block_type_name: ClassVar[str] = "GCP Target"
    _block_type_slug: ClassVar[str] = "gcp-target"
    _description: ClassVar[str] = "GCP project, region and resource names for serving Hugging Face models with vLLM."

    project: str = Field(..., description="GCP project id, e.g. 'acme-ml-prod'.")
    region: str = Field(..., description="Region for the service, bucket, registry and subnet, e.g. 'us-central1'.")
    bucket: str | None = Field(
        None,
        description="Bucket that caches model weights; defaults to '{project}-{region}-hf-model-cache'. "
        "It must be in the same single region as the service (lesson 18).",
    )
    build_bucket: str | None = Field(
        None,
        description="Bucket for Cloud Build sources and logs, created only when a profile builds its image; defaults "
        "to '{project}-{region}-hf-builds'. The build identity holds Storage Admin on it (what Cloud Build asks of a "
        "user-chosen build account's logs bucket), so it is never the model bucket.",
    )
    model_prefix: str = Field("model-cache", description="Object prefix for staged weights inside the bucket.")
    artifact_repository: str = Field("vllm-images", description="Artifact Registry Docker repository for images.")
    network: str = Field("vllm-serving", description="VPC network for Direct VPC egress.")
    subnet: str = Field("vllm-serving-subnet", description="Subnet (Private Google Access on) for Direct VPC egress.")
    subnet_range: str = Field(
        "10.8.0.0/26", description="Primary IPv4 range of the subnet; Direct VPC egress needs at least a /26."
    )
    service_account_name: str = Field(
        "vllm-serving", description="Account id of the dedicated service account the service runs as."
    )
    build_service_account_name: str = Field(
        "hf-cloudrun-build",
        description="Account id of the dedicated build identity Cloud Build runs as: it may only read build sources "
        "and write build logs in the bucket and push to the repository (new projects' default build identity has no "
        "rights there).",
    )
    build_region: str = Field(
        "global",
        description="Cloud Build location the image builds run in: 'global' (Cloud Build's global default pool, "
        "which every project may use) or a region such as 'us-central1'. The images still go to the Artifact "
        "Registry repository in `region`. Cloud Build restricts some projects, new ones among them, to a few "
        "regions (us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1) and "
        "refuses builds elsewhere ('due to quota restrictions, cannot run builds in this region'); set a region only "
        "when the project may build there (doctor's 'Cloud Build region' row says).",
    )
    hf_token_secret: str = Field(
        "hf-token",
        description="Secret Manager secret holding the Hub token when something needs it at run time "
        "(a build that pulls gated code, a service loading from the Hub).",
    )
    labels: dict[str, str] = Field(
        default_factory=lambda: {"managed-by": "hf-cloudrun-pipeline"},
        description="Labels put on every resource for cost attribution (lesson 17).",
    )
    invokers: list[str] = Field(
        default_factory=list,
        description="Principals granted roles/run.invoker on services, e.g. 'group:ml-apps@example.com'. "
        "Services stay private; public access is not offered (lesson 21).",
    )
    endpoints: ApiEndpoints | None = Field(
        None, description="Non-default API endpoints (emulators, the offline sandbox). Leave empty for GCP."
    )
    anonymous_credentials: bool = Field(
        False, description="Send no credentials: only for endpoints that are local stand-ins."
    )
    gcp_credentials: GcpCredentials | None = Field(
        None, description="prefect-gcp credentials block; Application Default Credentials when empty."
    )
    doctor_before_promote: bool = Field(
        False,
        description="Run doctor's read-only project checks as promote-model's first step and stop on any failure "
        "(APIs, permissions, GPU quota, organisation policies, bucket location).",
    )
    operation_poll_seconds: float | None = Field(
        None, gt=0, le=60, description="Polling interval for long-running operations; the client default when empty."
    )
    metrics_sample_seconds: float = Field(
        60,
        gt=0,
        le=3600,
        description="How often Cloud Monitoring samples the Cloud Run request metrics (60 s, Google Cloud metrics "
        "'run'): a promotion's watch reads them at this period and watches a whole number of these periods.",
    )
    metrics_delay_seconds: float = Field(
        180,
        ge=0,
        le=3600,
        description="How long a sample may take to become visible (Cloud Run: up to 180 s): a traffic step is judged "
        "whole only once its window's samples can all be seen.",
    )

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not PROJECT_ID.match(value):
            raise ValueError(
                f"project '{value}' is not a GCP project id: use 6-30 lowercase letters, digits or hyphens, "
                "starting with a letter (the id, not the display name or number)"
            )
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not REGION.match(value):
            raise ValueError(f"region '{value}' is not a GCP region name such as 'us-central1' (a zone is not)")
        return value

    @field_validator("build_region")
    @classmethod
    def _build_region(cls, value: str) -> str:
        if value != GLOBAL and not REGION.match(value):
            raise ValueError(
                f"build_region '{value}' is not a Cloud Build location: use 'global' or a region such as "
                "'us-central1' (a zone is not)"
            )
        return value

    @field_validator("bucket", "build_bucket")
    @classmethod
    def _bucket(cls, value: str | None, info) -> str | None:
        if value is not None:
            check_bucket_name(value, info.field_name)
        return value

    @field_validator("model_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.strip("/")
        if not value or any(part in ("", ".", "..") for part in value.split("/")):
            raise ValueError(f"model_prefix '{value}' must be a plain object path such as 'model-cache'")
        return value

    @field_validator("artifact_repository", "network", "subnet")
    @classmethod
    def _resource_id(cls, value: str, info) -> str:
        if len(value) > 63 or not RESOURCE_ID.match(value):
            raise ValueError(
                f"{info.field_name} '{value}' must be 1-63 lowercase letters, digits or hyphens, starting with a "
                "letter and not ending with a hyphen"
            )
        return value

    @field_validator("service_account_name", "build_service_account_name")
    @classmethod
    def _account_id(cls, value: str, info) -> str:
        if not 6 <= len(value) <= 30 or not RESOURCE_ID.match(value):
            raise ValueError(
                f"{info.field_name} '{value}' must be 6-30 lowercase letters, digits or hyphens, starting with "
                "a letter (it becomes NAME@PROJECT.iam.gserviceaccount.com)"
            )
        return value

    @field_validator("subnet_range")
    @classmethod
    def _subnet_range(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"subnet_range '{value}' is not an IPv4 CIDR range such as '10.8.0.0/26': {exc}") from None
        if not network.is_private:
            raise ValueError(f"subnet_range '{value}' must be a private (RFC 1918) range such as '10.8.0.0/26'")
        if network.prefixlen > 26:
            raise ValueError(
                f"subnet_range '{value}' is too small: Direct VPC egress needs at least a /26 (64 addresses, "
                "reserved in /28 blocks per instance); use e.g. '10.8.0.0/26'"
            )
        return value

    @field_validator("hf_token_secret")
    @classmethod
    def _secret_id(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9_-]{1,255}$", value):
            raise ValueError(
                f"hf_token_secret '{value}' must be 1-255 letters, digits, '_' or '-' (a Secret Manager id)"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(label):
                raise ValueError(
                    f"labels: '{key}={label}' is not a valid GCP label: keys start with a lowercase letter, keys "
                    "and values use lowercase letters, digits, '_' or '-' and at most 63 characters"
                )
        return value

    @field_validator("invokers")
    @classmethod
    def _invokers(cls, value: list[str]) -> list[str]:
        for member in value:
            if member in ("allUsers", "allAuthenticatedUsers"):
                raise ValueError(
                    f"invokers: '{member}' would make the service public; services stay private (lesson 21): "
                    "list the users, groups or service accounts that call it instead"
                )
            if not PRINCIPAL.match(member):
                raise ValueError(
                    f"invokers: '{member}' is not an IAM principal; write it as 'user:EMAIL', 'group:EMAIL' or "
                    "'serviceAccount:EMAIL'"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> GcpTarget:
        if self.bucket is None:
            self.bucket = f"{self.project}-{self.region}-hf-model-cache"
            check_bucket_name(self.bucket, "bucket (derived from project and region)")
        if self.build_bucket is None:
            self.build_bucket = f"{self.project}-{self.region}-hf-builds"
            check_bucket_name(self.build_bucket, "build_bucket (derived from project and region)")
        if self.build_bucket == self.bucket:
            # The build identity holds Storage Admin on the build bucket: on the model bucket it could replace weights.
            raise ValueError(
                f"build_bucket '{self.build_bucket}' is the model bucket; builds need a bucket of their own (the build "
                "identity administers it): name another one, or leave build_bucket empty"
            )
        if self.anonymous_credentials and not (self.endpoints and any(self.endpoints.model_dump().values())):
            raise ValueError(
                "anonymous_credentials is only for targets whose endpoints point at local stand-ins; set "
                "endpoints, or drop anonymous_credentials to use real credentials"
            )
        if self.anonymous_credentials and self.gcp_credentials is not None:
            raise ValueError("anonymous_credentials and gcp_credentials exclude each other; keep one")
        return self

    @property
    def bucket_name(self) -> str:
        assert self.bucket is not None
        return self.bucket

    @property
    def build_bucket_name(self) -> str:
        assert self.build_bucket is not None
        return self.build_bucket

    @property
    def service_account_email(self) -> str:
        return f"{self.service_account_name}@{self.project}.iam.gserviceaccount.com"

    @property
    def build_service_account_email(self) -> str:
        return f"{self.build_service_account_name}@{self.project}.iam.gserviceaccount.com"

    @property
    def location_path(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def build_location_path(self) -> str:
        """Where builds are created, read and listed: ``projects/P/locations/{build_region}`` (the regional path
        serves 'global' too: Cloud Build's builds.create reference lists global among its locations)."""
        return f"projects/{self.project}/locations/{self.build_region}"

    def endpoint(self, api: str) -> str | None:
        """The configured base URL of ``api`` (a field of ApiEndpoints), or None for Google's default."""
        return getattr(self.endpoints, api) if self.endpoints else None


def check_bucket_name(value: str, field: str) -> None:
    if value.startswith("gs://"):
        raise ValueError(f"{field} '{value}': give the bucket name without gs://, e.g. '{value[5:].strip('/')}'")
    if not BUCKET.match(value) or ".." in value or value.startswith("goog") or "google" in value:
        raise ValueError(
            f"{field} '{value}' is not a valid bucket name: 3-63 lowercase letters, digits, '-', '_' or '.', "
            f"starting and ending with a letter or digit, without 'goog' prefixes; set {field.split()[0]} explicitly"
        )
