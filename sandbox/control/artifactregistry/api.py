"""Artifact Registry API v1 for repositories, their IAM policies and Docker images, as the REST client calls it.

Paths come from ``artifactregistry_v1``'s REST transport (FACTS.md). Create and delete return long-running
operations from the shared store (``sandbox.control.operations``) that finish a few simulated seconds later,
so clients poll them as they do against Google. Images are not pushed over the Docker registry protocol:
Cloud Build (or a test, through the admin API) records them with ``record_image``, and Cloud Run asks
``find_image`` whether an image reference exists.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

from google.cloud import artifactregistry_v1 as ar
from google.protobuf import json_format, timestamp_pb2
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox import authz
from sandbox.control import ControlContext
from sandbox.control.artifactregistry.images import (
    DOCKER_HOST_SUFFIX,
    StoredImage,
    check_digest,
    check_image_name,
    check_tag,
    package_id,
    parse_reference,
)
from sandbox.control.errors import GoogleApiError, aborted, already_exists, invalid_argument, not_found
from sandbox.control.operations import paginate

if TYPE_CHECKING:
    from sandbox.control.operations import Operations

Format = ar.Repository.Format
Mode = ar.Repository.Mode
ScanConfig = ar.Repository.VulnerabilityScanningConfig.EnablementConfig
ScanState = ar.Repository.VulnerabilityScanningConfig.EnablementState

# Simulated seconds (scaled by the sandbox clock): at the default 0.01 a create finishes after 50 ms, so a
# client polling every 50 ms sees it running once or twice.
CREATE_SECONDS = 5.0
DELETE_SECONDS = 3.0

NOT_FOUND = "Requested entity was not found."
REPOSITORY_ID = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
MULTI_REGIONS = {"us", "europe", "asia"}
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
MEMBER = re.compile(
    r"^(allUsers|allAuthenticatedUsers|"
    r"(user|serviceAccount|group|domain|principal|principalSet|projectOwner|projectEditor|projectViewer):\S+)$"
)
EMPTY_POLICY_ETAG = "ACAB"  # what Google returns for a policy that was never set
# Fields a PATCH may change, by update_mask path; the rest are immutable or output only.
MUTABLE = {
    "description",
    "labels",
    "cleanup_policies",
    "cleanup_policy_dry_run",
    "vulnerability_scanning_config",
    "docker_config",
    "virtual_repository_config",
    "remote_repository_config",
    "disallow_unspecified_mode",
}
IMMUTABLE = {"name", "format_", "mode", "kms_key_name", "maven_config"}
OUTPUT_ONLY = {"create_time", "update_time", "size_bytes", "satisfies_pzs", "satisfies_pzi", "registry_uri"}


@dataclass
class RepositoryRecord:
    """A repository, its IAM policy and (for Docker) its images keyed by ``image@digest``."""

    repository: ar.Repository
    policy: dict = field(default_factory=lambda: {"version": 1, "etag": EMPTY_POLICY_ETAG})
    images: dict[str, StoredImage] = field(default_factory=dict)


class ArtifactRegistry:
    """Repositories, IAM policies and Docker images of the sandbox project.

    Python API for other modules: ``record_image(location, repository, image, digest, tags, size)`` when a
    build pushes, ``find_image(reference)`` to resolve ``LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG`` or
    ``...@sha256:...`` to the DockerImage JSON (None when it does not exist), ``repository(name)``.
    """

    name = "artifactregistry"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.repositories: dict[str, RepositoryRecord] = {}  # by full resource name

    @property
    def operations(self) -> Operations:
        ops = self.ctx.module("operations")
        assert ops is not None, "the Artifact Registry stand-in needs the shared operations module"
        return ops

    # Routing ----------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v1/projects/{project}/locations/{location}/repositories"
        repo = base + "/{repository}"
        # Custom methods (":getIamPolicy") share the last segment with the id, so they come before it.
        return [
            Route(base, self.list_repositories, methods=["GET"]),
            Route(base, self.create_repository, methods=["POST"]),
            Route(repo + ":getIamPolicy", self.get_iam_policy, methods=["GET"]),
            Route(repo + ":setIamPolicy", self.set_iam_policy, methods=["POST"]),
            Route(repo + ":testIamPermissions", self.test_iam_permissions, methods=["POST"]),
            Route(repo, self.get_repository, methods=["GET"]),
            Route(repo, self.update_repository, methods=["PATCH"]),
            Route(repo, self.delete_repository, methods=["DELETE"]),
            Route(repo + "/dockerImages", self.list_docker_images, methods=["GET"]),
            # The image part of a name is URL-encoded ("team%2Fvllm@sha256:..."). The REST client encodes the
            # segment once more, so it usually arrives as "team%2Fvllm"; a caller that does not arrives
            # decoded with a "/" in it: hence the path converter, and unquote() in the handlers.
            Route(repo + "/dockerImages/{image:path}", self.get_docker_image, methods=["GET"]),
            Route(repo + "/packages/{package:path}/tags", self.list_tags, methods=["GET"]),
            Route(repo + "/packages/{package:path}/tags/{tag}", self.get_tag, methods=["GET"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [
            Route("/state", self.admin_state, methods=["GET"]),
            Route("/images", self.admin_record_image, methods=["POST"]),
            Route("/find", self.admin_find_image, methods=["GET"]),
        ]

    async def shutdown(self) -> None:
        pass

    # Python API for other modules -------------------------------------------------------------------------
    def repository(self, name: str) -> ar.Repository | None:
        """The repository ``projects/P/locations/L/repositories/R``, or None."""
        record = self.repositories.get(name)
        return ar.Repository(record.repository) if record else None

    def record_image(
        self,
        location: str,
        repository: str,
        image: str,
        digest: str | None = None,
        tags: list[str] | tuple[str, ...] = (),
        size: int = 0,
        media_type: str | None = None,
    ) -> dict:
        """Store a pushed image (as a ``docker push`` of each tag would) and return its DockerImage JSON.

        A missing digest gets a random one. Tags move: a tag already on another digest of the same image
        leaves it, as in a registry. Raises GoogleApiError 404 when the repository does not exist (a push to
        a missing repository fails) and 400 when it is not a Docker repository or a name is malformed.
        """
        name = f"projects/{self.config.project}/locations/{location}/repositories/{repository}"
        record = self.repositories.get(name)
        if record is None:
            raise not_found(f'Repository "{name}" not found')
        if record.repository.format_ != Format.DOCKER:
            raise invalid_argument(f'Repository "{name}" is not a Docker repository')
        check_image_name(image)
        digest = digest or f"sha256:{secrets.token_hex(32)}"
        check_digest(digest)
        for tag in tags:
            check_tag(tag)
        stamp = _now()
        for other in record.images.values():
            if other.image == image and other.digest != digest and set(tags) & set(other.tags):
                other.tags = [t for t in other.tags if t not in tags]
                other.update_time = stamp
        key = f"{image}@{digest}"
        stored = record.images.get(key)
        if stored is None:
            stored = StoredImage(image, digest, [], int(size), stamp, stamp, stamp)
            record.images[key] = stored
        stored.tags = [*stored.tags, *(t for t in tags if t not in stored.tags)]
        stored.size_bytes = int(size) or stored.size_bytes
        stored.update_time = stamp
        if media_type:
            stored.media_type = media_type
        record.repository.size_bytes = sum(i.size_bytes for i in record.images.values())
        return self._image_json(record, stored)

    def find_image(self, reference: str) -> dict | None:
        """The DockerImage JSON that ``reference`` (``...-docker.pkg.dev/P/R/IMAGE:TAG`` or ``@sha256:``) names.

        None when the reference is not an Artifact Registry Docker reference of this project, or when the
        repository, tag or digest does not exist.
        """
        ref = parse_reference(reference)
        if ref is None or ref.project != self.config.project:
            return None
        record = self.repositories.get(f"projects/{ref.project}/locations/{ref.location}/repositories/{ref.repository}")
        if record is None:
            return None
        for stored in record.images.values():
            if stored.image != ref.image:
                continue
            if (ref.digest and stored.digest == ref.digest) or (not ref.digest and ref.tag in stored.tags):
                return self._image_json(record, stored)
        return None

    # Request helpers --------------------------------------------------------------------------------------
    def _parent(self, request: Request, permission: str) -> str:
        project, location = request.path_params["project"], request.path_params["location"]
        if project != self.config.project:
            resource = f"//artifactregistry.googleapis.com/projects/{project}/locations/{location}"
            repo = request.path_params.get("repository")
            if repo:
                resource += f"/repositories/{repo}"
            raise GoogleApiError(
                403, f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).", None
            )
        if not (REGION.match(location) or location in MULTI_REGIONS):
            raise invalid_argument(f'Invalid location "{location}": use a region such as us-central1.')
        return f"projects/{project}/locations/{location}"

    def _record(self, request: Request, permission: str) -> RepositoryRecord:
        name = f"{self._parent(request, permission)}/repositories/{request.path_params['repository']}"
        record = self.repositories.get(name)
        if record is None:
            raise not_found(NOT_FOUND)
        return record

    @staticmethod
    async def _json_body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None
        if not isinstance(body, dict):
            raise invalid_argument("Invalid JSON payload received. Expected an object.")
        return body

    async def _repository_body(self, request: Request) -> ar.Repository:
        raw = await request.body()
        try:
            return ar.Repository.from_json(raw or b"{}", ignore_unknown_fields=False)
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_argument(f"Invalid JSON payload received. {exc}") from None

    # Repositories -----------------------------------------------------------------------------------------
    async def create_repository(self, request: Request) -> JSONResponse:
        parent = self._parent(request, "artifactregistry.repositories.create")
        repository_id = request.query_params.get("repositoryId", "")
        if not REPOSITORY_ID.match(repository_id):
            raise invalid_argument(
                f'Invalid repository ID "{repository_id}": it must start with a lowercase letter, end with a '
                "letter or number, contain only lowercase letters, numbers and hyphens, and be at most 63 "
                "characters long."
            )
        spec = await self._repository_body(request)
        name = f"{parent}/repositories/{repository_id}"
        if spec.name and spec.name != name:
            raise invalid_argument(f'repository.name "{spec.name}" does not match "{name}"')
        if spec.format_ == Format.FORMAT_UNSPECIFIED:
            raise invalid_argument("repository.format: a repository format must be specified")
        _check_labels(dict(spec.labels))
        if name in self.repositories:
            raise already_exists("the repository already exists")
        repository = ar.Repository(spec)
        for output_only in OUTPUT_ONLY:
            delattr(repository, output_only)  # clients may echo them back; the server decides them
        repository.name = name
        repository.mode = repository.mode or Mode.STANDARD_REPOSITORY
        location = request.path_params["location"]
        repository.registry_uri = (
            f"{location}-{Format(repository.format_).name.lower()}.pkg.dev/{self.config.project}/{repository_id}"
        )
        stamp = _now()
        repository.create_time = stamp
        repository.update_time = stamp
        _scanning_state(repository, previous=None)
        # The repository exists as soon as the call is accepted (a duplicate create is refused at once, and
        # a client whose answer was lost finds it); the operation reports it done a moment later.
        self.repositories[name] = RepositoryRecord(repository=repository)
        op = self.operations.create(parent, metadata=ar.OperationMetadata())
        self.operations.finish_later(op.name, ar.Repository(repository), CREATE_SECONDS * self.config.time_scale)
        return self.operations.response(op)

    async def get_repository(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.get")
        return JSONResponse(_to_dict(record.repository))

    async def list_repositories(self, request: Request) -> JSONResponse:
        parent = self._parent(request, "artifactregistry.repositories.list")
        matches = _name_filter(request.query_params.get("filter", ""))
        order = request.query_params.get("orderBy", "").strip()
        if order not in ("", "name", "name asc", "name desc"):
            raise invalid_argument(f"sandbox: unsupported order_by {order!r} (only 'name [asc|desc]')")
        found = sorted(
            (r.repository for n, r in self.repositories.items() if n.startswith(parent + "/") and matches(n)),
            key=lambda r: r.name,
            reverse=order == "name desc",
        )
        page, token = paginate(found, request)
        body: dict = {"repositories": [_to_dict(r) for r in page]} if page else {}
        if token:
            body["nextPageToken"] = token
        return JSONResponse(body)

    async def update_repository(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.update")
        spec = await self._repository_body(request)
        current = record.repository
        if spec.name and spec.name != current.name:
            raise invalid_argument(f'repository.name "{spec.name}" does not match "{current.name}"')
        mask = [p for p in request.query_params.get("updateMask", "").split(",") if p.strip()]
        # AIP-134: no mask means every field the request sets.
        paths = [_snake(p.strip()) for p in mask] or [
            f.name for f, _ in ar.Repository.pb(spec).ListFields() if f.name in MUTABLE
        ]
        updated = ar.Repository(current)
        for path in paths:
            top, _, sub = path.partition(".")
            if top in IMMUTABLE:
                raise invalid_argument(f'update_mask: field "{path}" is immutable')
            if top in OUTPUT_ONLY:
                raise invalid_argument(f'update_mask: field "{path}" is output only')
            if top not in MUTABLE:
                raise invalid_argument(f'update_mask: invalid field path "{path}"')
            if sub:
                if top != "vulnerability_scanning_config" or sub != "enablement_config":
                    raise invalid_argument(f'update_mask: invalid field path "{path}"')
                updated.vulnerability_scanning_config.enablement_config = (
                    spec.vulnerability_scanning_config.enablement_config
                )
            else:
                setattr(updated, top, getattr(spec, top))
        _check_labels(dict(updated.labels))
        _scanning_state(updated, previous=current)
        updated.update_time = _now()
        record.repository = updated
        return JSONResponse(_to_dict(updated))

    async def delete_repository(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.delete")
        parent = record.repository.name.rsplit("/repositories/", 1)[0]
        # Gone at once (its images with it), so nothing can push to or pull from it meanwhile.
        del self.repositories[record.repository.name]
        op = self.operations.create(parent, metadata=ar.OperationMetadata())
        self.operations.finish_later(op.name, None, DELETE_SECONDS * self.config.time_scale)
        return self.operations.response(op)

    # IAM --------------------------------------------------------------------------------------------------
    async def get_iam_policy(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.getIamPolicy")
        return JSONResponse(record.policy)

    async def set_iam_policy(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.setIamPolicy")
        policy = (await self._json_body(request)).get("policy") or {}
        # Read-modify-write: a policy read before someone else's write carries the old etag.
        if policy.get("etag") and policy["etag"] != record.policy["etag"]:
            raise aborted(
                "There were concurrent policy changes. Please retry the whole read-modify-write with exponential "
                "backoff."
            )
        bindings = []
        for binding in policy.get("bindings", []):
            if not str(binding.get("role", "")).startswith("roles/"):
                raise invalid_argument(f"Role {binding.get('role')!r} is not a valid role name.")
            for member in binding.get("members", []):
                if not MEMBER.match(member):
                    raise invalid_argument(f"Invalid principal: {member}")
                iam = self.ctx.module("iam")
                missing = iam.missing_account(member) if iam and member.startswith("serviceAccount:") else None
                if missing:  # missing, or too new for IAM to have propagated it (sandbox/control/iam, visible())
                    raise invalid_argument(missing)
            if binding.get("members"):
                bindings.append(binding)
        record.policy = {"version": policy.get("version") or 1, "etag": _new_etag()}
        if bindings:
            record.policy["bindings"] = bindings
        return JSONResponse(record.policy)

    async def test_iam_permissions(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.repositories.get")
        # What the caller holds on this repository, through the project's policy and the repository's own.
        asked = list((await self._json_body(request)).get("permissions") or [])
        held = authz.held_permissions(self.ctx, authz.caller(self.ctx, request.scope), asked, record.repository.name)
        return JSONResponse({"permissions": held} if held else {})

    # Docker images and tags -------------------------------------------------------------------------------
    async def list_docker_images(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.dockerimages.list")
        images = sorted(record.images.values(), key=lambda i: (i.image, i.upload_time.ToNanoseconds()))
        page, token = paginate(images, request)
        body: dict = {"dockerImages": [self._image_json(record, i) for i in page]} if page else {}
        if token:
            body["nextPageToken"] = token
        return JSONResponse(body)

    async def get_docker_image(self, request: Request) -> JSONResponse:
        record = self._record(request, "artifactregistry.dockerimages.get")
        stored = record.images.get(unquote(request.path_params["image"]))
        if stored is None:
            raise not_found(NOT_FOUND)
        return JSONResponse(self._image_json(record, stored))

    def _package_images(self, request: Request, permission: str) -> tuple[RepositoryRecord, str, list[StoredImage]]:
        record = self._record(request, permission)
        image = unquote(request.path_params["package"])
        images = [i for i in record.images.values() if i.image == image]
        if not images:
            raise not_found(NOT_FOUND)
        return record, image, images

    async def list_tags(self, request: Request) -> JSONResponse:
        record, _, images = self._package_images(request, "artifactregistry.tags.list")
        version = _version_filter(request.query_params.get("filter", ""))
        tags = sorted(
            (self._tag(record, i, t) for i in images for t in i.tags),
            key=lambda t: t.name,
        )
        if version is not None:
            tags = [t for t in tags if t.version == version]
        page, token = paginate(tags, request)
        body: dict = {"tags": [_to_dict(t) for t in page]} if page else {}
        if token:
            body["nextPageToken"] = token
        return JSONResponse(body)

    async def get_tag(self, request: Request) -> JSONResponse:
        record, _, images = self._package_images(request, "artifactregistry.tags.get")
        tag = request.path_params["tag"]
        for stored in images:
            if tag in stored.tags:
                return JSONResponse(_to_dict(self._tag(record, stored, tag)))
        raise not_found(NOT_FOUND)

    def _tag(self, record: RepositoryRecord, stored: StoredImage, tag: str) -> ar.Tag:
        package = f"{record.repository.name}/packages/{package_id(stored.image)}"
        return ar.Tag(name=f"{package}/tags/{tag}", version=f"{package}/versions/{stored.digest}")

    def _image_json(self, record: RepositoryRecord, stored: StoredImage) -> dict:
        repo = record.repository.name
        _, project, _, location, _, repository = repo.split("/")
        image = ar.DockerImage(
            name=f"{repo}/dockerImages/{package_id(stored.image)}@{stored.digest}",
            uri=f"{location}{DOCKER_HOST_SUFFIX}/{project}/{repository}/{stored.image}@{stored.digest}",
            tags=list(stored.tags),
            image_size_bytes=stored.size_bytes,
            upload_time=stored.upload_time,
            media_type=stored.media_type,
            build_time=stored.build_time,
            update_time=stored.update_time,
        )
        return _to_dict(image)

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_state(self, _: Request) -> JSONResponse:
        return JSONResponse(
            {
                "repositories": [_to_dict(r.repository) for r in self.repositories.values()],
                "policies": {name: r.policy for name, r in self.repositories.items()},
                "dockerImages": [self._image_json(r, i) for r in self.repositories.values() for i in r.images.values()],
            }
        )

    async def admin_record_image(self, request: Request) -> JSONResponse:
        """``{"repository", "image", "location"?, "digest"?, "tags"?, "sizeBytes"?}`` as a push would store it."""
        body = await self._json_body(request)
        if not body.get("repository") or not body.get("image"):
            raise invalid_argument("'repository' and 'image' are required")
        image = self.record_image(
            location=body.get("location") or self.config.region,
            repository=body["repository"],
            image=body["image"],
            digest=body.get("digest"),
            tags=list(body.get("tags") or []),
            size=int(body.get("sizeBytes") or 0),
            media_type=body.get("mediaType"),
        )
        return JSONResponse(image)

    async def admin_find_image(self, request: Request) -> JSONResponse:
        """``?ref=IMAGE_REFERENCE``: the DockerImage JSON, or 404 (what Cloud Run's stand-in asks)."""
        found = self.find_image(request.query_params.get("ref", ""))
        if found is None:
            return JSONResponse({"error": "image not found"}, status_code=404)
        return JSONResponse(found)


# Helpers ----------------------------------------------------------------------------------------------------
def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(dt.datetime.now(dt.UTC))
    return stamp


def _new_etag() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


def _to_dict(message) -> dict:
    """JSON as the REST API sends it: camelCase, enums as names, zero values omitted."""
    return json_format.MessageToDict(type(message).pb(message))


def _snake(path: str) -> str:
    """``vulnerabilityScanningConfig.enablementConfig`` -> ``vulnerability_scanning_config.enablement_config``."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", path).lower()
    return "format_" if snake == "format" else snake


def _check_labels(labels: dict[str, str]) -> None:
    if len(labels) > 64:
        raise invalid_argument("repository.labels: at most 64 labels are allowed")
    for key, value in labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise invalid_argument(
                f"repository.labels: invalid label {key}={value!r}: keys start with a lowercase letter; keys and "
                "values use lowercase letters, digits, '_' and '-', at most 63 characters"
            )


def _scanning_state(repository: ar.Repository, previous: ar.Repository | None) -> None:
    """Fill the output-only scanning state from the config (FACTS.md: INHERITED is active, DISABLED is not)."""
    scanning = repository.vulnerability_scanning_config
    if repository.format_ != Format.DOCKER:
        scanning.enablement_state = ScanState.SCANNING_UNSUPPORTED
        scanning.enablement_state_reason = "Vulnerability scanning is not supported for this repository format."
    elif scanning.enablement_config == ScanConfig.DISABLED:
        scanning.enablement_state = ScanState.SCANNING_DISABLED
        scanning.enablement_state_reason = "Repository has vulnerability scanning set to DISABLED."
    else:
        # INHERITED (or unset, which behaves the same): the project's Container Scanning API is on here.
        was_active = previous is not None and (
            previous.vulnerability_scanning_config.enablement_state == ScanState.SCANNING_ACTIVE
        )
        if not was_active:
            scanning.last_enable_time = _now()
        scanning.enablement_state = ScanState.SCANNING_ACTIVE
        scanning.enablement_state_reason = "API containerscanning.googleapis.com is enabled."


def _name_filter(text: str):
    """The ``name="..."`` list filter (a trailing ``*`` matches a prefix); others are refused, not ignored."""
    if not text.strip():
        return lambda _name: True
    match = re.fullmatch(r'\s*name\s*=\s*"([^"]*)"\s*', text)
    if match is None:
        raise invalid_argument(f'sandbox: unsupported filter {text!r} (only name="...")')
    wanted = match[1]
    if wanted.endswith("*"):
        return lambda name: name.startswith(wanted[:-1])
    return lambda name: name == wanted


def _version_filter(text: str) -> str | None:
    """The ``version="..."`` tag filter; others are refused rather than silently ignored."""
    if not text.strip():
        return None
    match = re.fullmatch(r'\s*version\s*=\s*"([^"]*)"\s*', text)
    if match is None:
        raise invalid_argument(f'sandbox: unsupported filter {text!r} (only version="...")')
    return match[1]
