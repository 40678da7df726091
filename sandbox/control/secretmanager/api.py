"""Secret Manager API v1 (global secrets), as the REST transport of ``secretmanager_v1`` calls it.

Secrets, numbered versions (1, 2, ...) with states ENABLED / DISABLED / DESTROYED, ``latest`` and version
aliases, CRC32C checks on ``:addVersion``, and an IAM policy per secret. Resource names in answers carry
the project NUMBER, as the real API's do (``projects/123456789012/secrets/s``); requests may name the
project by id or number. Etag mismatches are 409 ABORTED; accessing a version that is not enabled is
400 FAILED_PRECONDITION "Secret Version [...] is in DISABLED state.", as on GCP.

Payloads never leave through the admin API: ``/_sandbox/secretmanager/state`` lists secrets and versions
without them. Other modules read values through ``value`` / ``latest_value``; who may read them is
``sandbox.authz.has_permission``'s answer, from the project's and the secret's ``policy``.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from dataclasses import dataclass, field

import google_crc32c
from google.cloud import secretmanager_v1 as sm
from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox import authz
from sandbox.control import ControlContext
from sandbox.control.body import json_object
from sandbox.control.errors import (
    GoogleApiError,
    aborted,
    already_exists,
    failed_precondition,
    invalid_argument,
    not_found,
)
from sandbox.control.iam import ResourcePolicy, project_number
from sandbox.control.orgpolicy.locations import check_location

State = sm.SecretVersion.State
SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
LOCATION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
MAX_PAYLOAD_BYTES = 65536
MAX_LABELS = 64
MAX_PAGE_SIZE = 25000
# Secret fields an update mask may name (camelCase as the client sends them -> proto field).
UPDATABLE = {
    "labels": "labels",
    "annotations": "annotations",
    "topics": "topics",
    "rotation": "rotation",
    "expireTime": "expire_time",
    "ttl": "ttl",
    "versionAliases": "version_aliases",
    "versionDestroyTtl": "version_destroy_ttl",
}


@dataclass
class VersionRecord:
    """A version's metadata and its payload (``None`` once destroyed)."""

    number: int
    version: sm.SecretVersion
    data: bytes | None
    crc32c: int


@dataclass
class SecretRecord:
    secret_id: str
    secret: sm.Secret
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    next_version: int = 1
    policy: ResourcePolicy = field(default_factory=ResourcePolicy)


class SecretManager:
    """Secrets of the sandbox project, their versions and IAM policies."""

    name = "secretmanager"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.project_number = project_number(ctx.config)
        self.secrets: dict[str, SecretRecord] = {}  # by secret id, in creation order

    # Python API for other modules ---------------------------------------------------------------------------
    def exists(self, secret_name: str) -> bool:
        """Whether the secret exists. Names: ``s``, ``projects/{id or number}/secrets/s[/versions/v]``."""
        return self._lookup(secret_name)[0] is not None

    def value(self, secret_name: str, version: str = "latest") -> bytes | None:
        """The payload of an ENABLED version (a ``/versions/v`` suffix on the name wins), else None."""
        record, version = self._lookup(secret_name, version)
        found = self._find_version(record, version) if record else None
        if found is None or found.version.state != State.ENABLED:
            return None
        return found.data

    def latest_value(self, secret_name: str) -> bytes | None:
        """The payload of the newest version if it is ENABLED (GCP does not fall back to an older one)."""
        return self.value(secret_name, "latest")

    def version_info(self, secret_name: str, version: str = "latest") -> dict | None:
        """The version's REST JSON (``name``, ``state``, ``createTime``; never the payload), or None."""
        record, version = self._lookup(secret_name, version)
        found = self._find_version(record, version) if record else None
        return _to_json(found.version) if found else None

    def policy(self, secret_name: str) -> dict:
        """The secret's IAM policy JSON, always with a ``bindings`` list; an empty policy if no such secret."""
        record, _ = self._lookup(secret_name)
        body = (record.policy if record else ResourcePolicy()).to_json()
        body.setdefault("bindings", [])
        return body

    # Routing ------------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v1/projects/{project}/secrets"
        return [
            Route(base, self.list_secrets, methods=["GET"]),
            Route(base, self.create_secret, methods=["POST"]),
            Route(f"{base}/{{secret}}", self.secret_get, methods=["GET"]),
            Route(f"{base}/{{secret}}", self.secret_post, methods=["POST"]),
            Route(f"{base}/{{secret}}", self.update_secret, methods=["PATCH"]),
            Route(f"{base}/{{secret}}", self.delete_secret, methods=["DELETE"]),
            Route(f"{base}/{{secret}}/versions", self.list_versions, methods=["GET"]),
            Route(f"{base}/{{secret}}/versions/{{version}}", self.version_get, methods=["GET"]),
            Route(f"{base}/{{secret}}/versions/{{version}}", self.version_post, methods=["POST"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [Route("/state", self.admin_state, methods=["GET"])]

    async def shutdown(self) -> None:
        pass

    # Names --------------------------------------------------------------------------------------------------
    def _secret_name(self, secret_id: str) -> str:
        return f"projects/{self.project_number}/secrets/{secret_id}"

    def _lookup(self, secret_name: str, version: str = "latest") -> tuple[SecretRecord | None, str]:
        """Parse a name given to the Python API; returns the record (or None) and the version to use."""
        parts = secret_name.split("/")
        if len(parts) == 1:
            return self.secrets.get(secret_name), version
        if len(parts) in (4, 6) and parts[0] == "projects" and parts[2] == "secrets":
            if parts[1] not in (self.config.project, self.project_number):
                return None, version
            if len(parts) == 6:
                if parts[4] != "versions":
                    return None, version
                version = parts[5]
            return self.secrets.get(parts[3]), version
        return None, version

    def _project(self, request: Request, permission: str, resource: str = "") -> None:
        project = request.path_params["project"]
        if project not in (self.config.project, self.project_number):
            target = f"projects/{project}" + (f"/secrets/{resource}" if resource else "")
            raise GoogleApiError(
                403, f"Permission '{permission}' denied for resource '{target}' (or it may not exist)."
            )

    def _record(self, request: Request, permission: str) -> tuple[SecretRecord, str]:
        """The secret in the path and the custom verb after ``:``, if any."""
        secret_id, _, verb = request.path_params["secret"].partition(":")
        self._project(request, permission, secret_id)
        record = self.secrets.get(secret_id)
        if record is None:
            raise not_found(f"Secret [{self._secret_name(secret_id)}] not found.")
        return record, verb

    def _find_version(self, record: SecretRecord, version_id: str) -> VersionRecord | None:
        if version_id == "latest":
            number = max(record.versions, default=0)
        elif version_id.isdigit():
            number = int(version_id)
        else:
            number = dict(record.secret.version_aliases).get(version_id, 0)
        found = record.versions.get(number)
        if found is not None:
            _settle(found)
        return found

    def _version(self, request: Request, permission: str) -> tuple[SecretRecord, VersionRecord, str]:
        """The version in the path (number, ``latest`` or an alias) and the verb after ``:``, if any."""
        secret_id = request.path_params["secret"]
        version_id, _, verb = request.path_params["version"].partition(":")
        self._project(request, permission, secret_id)
        record = self.secrets.get(secret_id)
        found = self._find_version(record, version_id) if record else None
        if found is None:
            if version_id == "latest" or record is None:
                raise not_found(f"Secret [{self._secret_name(secret_id)}] not found or has no versions.")
            raise not_found(f"Secret Version [{self._secret_name(secret_id)}/versions/{version_id}] not found.")
        return record, found, verb

    # Secrets ------------------------------------------------------------------------------------------------
    async def create_secret(self, request: Request) -> JSONResponse:
        secret_id = request.query_params.get("secretId", "")
        self._project(request, "secretmanager.secrets.create")
        if not SECRET_ID.match(secret_id):
            raise invalid_argument(
                f"Invalid secret id '{secret_id}': use 1 to 255 letters, digits, hyphens and underscores."
            )
        spec = _parse(sm.Secret, await request.body())
        _check_replication(spec.replication)
        for location in _replica_locations(spec.replication):
            check_location(self.config, self.project_number, location, "secret")
        _check_labels(spec.labels)
        if spec.version_aliases:
            raise invalid_argument("version_aliases must refer to existing versions; a new secret has none.")
        name = self._secret_name(secret_id)
        if secret_id in self.secrets:
            raise already_exists(f"Secret [{name}] already exists.")
        secret = sm.Secret(spec)
        secret.name = name
        secret.create_time = _now()
        secret.etag = _new_etag()
        _apply_ttl(secret)
        self.secrets[secret_id] = SecretRecord(secret_id=secret_id, secret=secret)
        return self._json(request, secret)

    async def list_secrets(self, request: Request) -> JSONResponse:
        self._project(request, "secretmanager.secrets.list")
        query = request.query_params.get("filter", "")
        newest_first = [r.secret for r in reversed(self.secrets.values())]
        matching = [s for s in newest_first if _matches(query, _secret_fields(s))]
        page, token = _page(request, matching)
        response = sm.ListSecretsResponse(secrets=page, next_page_token=token, total_size=0 if query else len(matching))
        return self._json(request, response)

    async def secret_get(self, request: Request) -> JSONResponse:
        record, verb = self._record(request, "secretmanager.secrets.get")
        if verb == "getIamPolicy":
            return JSONResponse(record.policy.to_json())
        if verb:
            raise not_found(f"Method '{verb}' not found.")
        return self._json(request, record.secret)

    async def secret_post(self, request: Request) -> JSONResponse:
        verb = request.path_params["secret"].partition(":")[2]
        if verb == "addVersion":
            return await self.add_version(request)
        if verb not in ("setIamPolicy", "testIamPermissions"):
            raise not_found(f"Method '{verb or 'POST'}' not found.")
        record, _ = self._record(request, f"secretmanager.secrets.{verb}")
        body = json_object(await request.body())
        if verb == "setIamPolicy":
            iam = self.ctx.module("iam")
            check = iam.require_service_account if iam is not None else None
            return JSONResponse(record.policy.set_from_request(body, check))
        # What the caller holds on this secret, through the project's policy and the secret's own.
        name = f"projects/{self.config.project}/secrets/{record.secret.name.rsplit('/', 1)[-1]}"
        caller = authz.caller(self.ctx, request.scope)
        held = authz.held_permissions(self.ctx, caller, list(body.get("permissions") or []), name)
        return JSONResponse({"permissions": held} if held else {})

    async def update_secret(self, request: Request) -> JSONResponse:
        record, _ = self._record(request, "secretmanager.secrets.update")
        spec = _parse(sm.Secret, await request.body())
        mask = [p.strip() for p in request.query_params.get("updateMask", "").split(",") if p.strip()]
        if not mask:
            raise invalid_argument("update_mask is required: name the Secret fields to update.")
        if spec.etag and spec.etag != record.secret.etag:
            raise aborted(f"The etag provided does not match the current etag of Secret [{record.secret.name}].")
        updated = sm.Secret(record.secret)
        for path in mask:
            top = _camel(path.split(".")[0])
            if top not in UPDATABLE:
                raise invalid_argument(f"update_mask: field '{path}' cannot be updated.")
            proto_field = UPDATABLE[top]
            setattr(updated, proto_field, getattr(spec, proto_field))
        _check_labels(updated.labels)
        self._check_aliases(record, updated)
        _apply_ttl(updated)
        updated.etag = _new_etag()
        record.secret = updated
        return self._json(request, updated)

    async def delete_secret(self, request: Request) -> JSONResponse:
        record, _ = self._record(request, "secretmanager.secrets.delete")
        etag = request.query_params.get("etag")
        if etag and etag != record.secret.etag:
            raise aborted(f"The etag provided does not match the current etag of Secret [{record.secret.name}].")
        del self.secrets[record.secret_id]
        return JSONResponse({})

    def _check_aliases(self, record: SecretRecord, secret: sm.Secret) -> None:
        for alias, number in dict(secret.version_aliases).items():
            if not ALIAS.match(alias) or alias.lower() in ("latest", "new"):
                raise invalid_argument(f"Invalid version alias '{alias}'.")
            if number not in record.versions:
                raise invalid_argument(f"Version alias '{alias}' refers to version {number}, which does not exist.")

    # Versions -----------------------------------------------------------------------------------------------
    async def add_version(self, request: Request) -> JSONResponse:
        record, _ = self._record(request, "secretmanager.versions.add")
        add = _parse(sm.AddSecretVersionRequest, await request.body())
        data = add.payload.data
        if len(data) > MAX_PAYLOAD_BYTES:
            raise invalid_argument(f"Secret payload is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes.")
        crc = google_crc32c.value(data)
        client_checksum = "data_crc32c" in add.payload
        if client_checksum and add.payload.data_crc32c != crc:
            raise invalid_argument(
                f"Checksum mismatch: data_crc32c {add.payload.data_crc32c} does not match the CRC32C of the "
                "payload data; the data may have been corrupted in transit."
            )
        number = record.next_version
        record.next_version += 1
        version = sm.SecretVersion(
            name=f"{record.secret.name}/versions/{number}",
            create_time=_now(),
            state=State.ENABLED,
            replication_status=_replication_status(record.secret.replication),
            etag=_new_etag(),
            client_specified_payload_checksum=client_checksum,
        )
        record.versions[number] = VersionRecord(number=number, version=version, data=data, crc32c=crc)
        return self._json(request, version)

    async def list_versions(self, request: Request) -> JSONResponse:
        record, _ = self._record(request, "secretmanager.versions.list")
        query = request.query_params.get("filter", "")
        newest_first = [v for _, v in sorted(record.versions.items(), reverse=True)]
        for found in newest_first:
            _settle(found)
        matching = [v.version for v in newest_first if _matches(query, _version_fields(v.version))]
        page, token = _page(request, matching)
        response = sm.ListSecretVersionsResponse(
            versions=page, next_page_token=token, total_size=0 if query else len(matching)
        )
        return self._json(request, response)

    async def version_get(self, request: Request) -> JSONResponse:
        verb = request.path_params["version"].partition(":")[2]
        if verb not in ("", "access"):
            raise not_found(f"Method '{verb}' not found.")
        permission = "secretmanager.versions.access" if verb else "secretmanager.versions.get"
        _, found, _ = self._version(request, permission)
        if not verb:
            return self._json(request, found.version)
        if found.version.state != State.ENABLED:
            raise failed_precondition(f"Secret Version [{found.version.name}] is in {found.version.state.name} state.")
        response = sm.AccessSecretVersionResponse(
            name=found.version.name, payload=sm.SecretPayload(data=found.data, data_crc32c=found.crc32c)
        )
        return self._json(request, response)

    async def version_post(self, request: Request) -> JSONResponse:
        verb = request.path_params["version"].partition(":")[2]
        if verb not in ("enable", "disable", "destroy"):
            raise not_found(f"Method '{verb or 'POST'}' not found.")
        record, found, _ = self._version(request, f"secretmanager.versions.{verb}")
        body = json_object(await request.body())
        version = found.version
        if body.get("etag") and body["etag"] != version.etag:
            raise aborted(f"The etag provided does not match the current etag of Secret Version [{version.name}].")
        if version.state == State.DESTROYED:
            raise failed_precondition(f"Secret Version [{version.name}] is in DESTROYED state.")
        if verb == "enable":
            version.state = State.ENABLED
        elif verb == "disable":
            version.state = State.DISABLED
        elif record.secret.version_destroy_ttl:
            # Delayed destroy: disabled now, destroyed once the secret's version_destroy_ttl has passed.
            version.state = State.DISABLED
            version.scheduled_destroy_time = _now() + record.secret.version_destroy_ttl
        else:
            _destroy(found)
        version.etag = _new_etag()
        return self._json(request, version)

    # JSON ---------------------------------------------------------------------------------------------------
    @staticmethod
    def _json(request: Request, message) -> JSONResponse:
        # The REST clients ask for integer enums ($alt=json;enum-encoding=int); the real front end obliges.
        ints = "enum-encoding=int" in request.query_params.get("$alt", "")
        return JSONResponse(_to_json(message, ints))

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_state(self, _: Request) -> JSONResponse:
        """Secrets, versions (metadata only: payloads and checksums are never exposed) and policies."""
        out = []
        for record in self.secrets.values():
            versions = []
            for number in sorted(record.versions):
                _settle(record.versions[number])
                versions.append(_to_json(record.versions[number].version))
            out.append({**_to_json(record.secret), "versions": versions, "policy": record.policy.to_json()})
        return JSONResponse({"projectNumber": self.project_number, "secrets": out})


# Helpers ----------------------------------------------------------------------------------------------------
def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_etag() -> str:
    # Secret Manager etags are quoted hex strings, e.g. "\"16130a5d2c8e29\"".
    return f'"{secrets.token_hex(7)}"'


def _to_json(message, ints: bool = False) -> dict:
    return json_format.MessageToDict(type(message).pb(message), use_integers_for_enums=ints)


def _parse(message_type, raw: bytes):
    try:
        return message_type.from_json(raw or b"{}")
    except (json_format.ParseError, ValueError) as exc:
        raise invalid_argument(f"Invalid JSON payload received. {exc}") from None


def _camel(path: str) -> str:
    head, *rest = path.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _check_replication(replication: sm.Replication) -> None:
    kind = sm.Replication.pb(replication).WhichOneof("replication")
    if kind is None:
        raise invalid_argument("Secret.replication is required: set replication.automatic or replication.userManaged.")
    if kind == "user_managed":
        locations = [r.location for r in replication.user_managed.replicas]
        if not locations:
            raise invalid_argument("Secret.replication.userManaged.replicas must not be empty.")
        for location in locations:
            if not LOCATION.match(location):
                raise invalid_argument(f"Invalid replica location '{location}'.")
        if len(set(locations)) != len(locations):
            raise invalid_argument("Secret.replication.userManaged.replicas must not repeat a location.")


def _replica_locations(replication: sm.Replication) -> list[str]:
    """Where a secret's payloads live: ``global`` for automatic replication, else each user-managed replica's."""
    if sm.Replication.pb(replication).WhichOneof("replication") == "automatic":
        return ["global"]
    return [r.location for r in replication.user_managed.replicas]


def _check_labels(labels) -> None:
    if len(labels) > MAX_LABELS:
        raise invalid_argument(f"A secret can have at most {MAX_LABELS} labels.")
    for key, value in dict(labels).items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise invalid_argument(
                f"Invalid label '{key}': '{value}'. Keys start with a lowercase letter; keys and values use "
                "lowercase letters, digits, '_' and '-', up to 63 characters."
            )


def _apply_ttl(secret: sm.Secret) -> None:
    """``ttl`` is input only: GCP answers with the ``expire_time`` it implies."""
    if sm.Secret.pb(secret).WhichOneof("expiration") == "ttl":
        secret.expire_time = _now() + secret.ttl


def _replication_status(replication: sm.Replication) -> sm.ReplicationStatus:
    if sm.Replication.pb(replication).WhichOneof("replication") == "user_managed":
        replicas = [
            sm.ReplicationStatus.UserManagedStatus.ReplicaStatus(location=r.location)
            for r in replication.user_managed.replicas
        ]
        return sm.ReplicationStatus(user_managed=sm.ReplicationStatus.UserManagedStatus(replicas=replicas))
    return sm.ReplicationStatus(automatic=sm.ReplicationStatus.AutomaticStatus())


def _destroy(found: VersionRecord) -> None:
    found.version.state = State.DESTROYED
    found.version.destroy_time = _now()
    found.version.scheduled_destroy_time = None
    found.data = None  # gone for good, as on GCP


def _settle(found: VersionRecord) -> None:
    """Finish a delayed destroy whose time has come (checked lazily whenever the version is read)."""
    version = found.version
    scheduled = version.scheduled_destroy_time if "scheduled_destroy_time" in version else None
    if version.state != State.DESTROYED and scheduled and _now() >= scheduled:
        _destroy(found)


def _page(request: Request, items: list) -> tuple[list, str]:
    try:
        size = int(request.query_params.get("pageSize") or 0)
        token = request.query_params.get("pageToken", "")
        start = int(token) if token else 0
    except ValueError:
        raise invalid_argument("Invalid page_size or page_token.") from None
    if size < 0 or start < 0 or start > len(items):
        raise invalid_argument("Invalid page_size or page_token.")
    size = min(size or MAX_PAGE_SIZE, MAX_PAGE_SIZE)  # 0: the server decides (here: everything up to the cap)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


def _secret_fields(secret: sm.Secret) -> dict[str, str]:
    fields = {"name": secret.name.rsplit("/", 1)[1]}
    fields.update({f"labels.{k}": v for k, v in dict(secret.labels).items()})
    return fields


def _version_fields(version: sm.SecretVersion) -> dict[str, str]:
    return {"name": version.name.rsplit("/", 1)[1], "state": version.state.name}


FILTER_TERM = re.compile(r"^(?P<field>[A-Za-z_][\w.-]*)(?P<op>[:=])(?P<value>.+)$")


def _matches(query: str, fields: dict[str, str]) -> bool:
    """A small subset of the list filter syntax: ``field:value`` / ``field=value`` terms joined by AND.

    ``labels.k:*`` means the label is present; ``name:x`` matches ids containing x. Anything else is 400,
    so a filter the sandbox cannot evaluate fails loudly instead of matching everything.
    """
    for term in query.split():
        if term.upper() == "AND":
            continue
        match = FILTER_TERM.match(term)
        if not match:
            raise invalid_argument(f"Invalid filter: '{query}'.")
        name, op, value = match["field"], match["op"], match["value"].strip('"')
        if name not in ("name", "state") and not name.startswith("labels."):
            raise invalid_argument(f"Invalid filter field '{name}' in '{query}'.")
        actual = fields.get(name)
        if actual is None:
            return False
        if value == "*" and op == ":":
            continue
        if name == "name" and op == ":":
            if value not in actual:
                return False
        elif actual != value:
            return False
    return True
