"""IAM API v1 service accounts, as ``gcloud iam service-accounts`` and the REST docs call them.

``iam_admin_v1`` has no REST transport (FACTS.md), so the product reaches this API with an
AuthorizedSession and plain JSON: ``POST /v1/projects/{p}/serviceAccounts`` with ``{accountId,
serviceAccount: {displayName, description}}``; get, patch, delete by email or unique id (``-`` may stand for
the project); ``:getIamPolicy`` / ``:setIamPolicy`` (both POST on this API) on an account. JSON follows the
real API: ``disabled`` is left out while false, an empty policy has no ``bindings`` key.

The project starts with the Compute Engine default service account, so a check that the product never runs
anything as that account has something to find.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox import authz
from sandbox.config import SandboxConfig
from sandbox.control import ControlContext
from sandbox.control.body import json_object
from sandbox.control.errors import GoogleApiError, already_exists, invalid_argument, not_found
from sandbox.control.iam.policy import ResourcePolicy
from sandbox.control.paging import offset_page

# The sandbox project's number (SandboxConfig has no field for it yet; see project_number()).
DEFAULT_PROJECT_NUMBER = "123456789012"
ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
MAX_DISPLAY_NAME_BYTES = 100
MAX_DESCRIPTION_BYTES = 256
PATCHABLE = {"displayName": "display_name", "description": "description"}


def project_number(config: SandboxConfig) -> str:
    """The sandbox project's number: a ``project_number`` setting if the config grows one, else the default."""
    return str(getattr(config, "project_number", None) or DEFAULT_PROJECT_NUMBER)


@dataclass
class ServiceAccount:
    """One service account and the IAM policy on it (who may act as it)."""

    account_id: str
    email: str
    unique_id: str
    display_name: str = ""
    description: str = ""
    disabled: bool = False
    etag: str = field(default_factory=lambda: base64.b64encode(secrets.token_bytes(8)).decode())
    # When the account was created (monotonic, real seconds): other APIs see it only once IAM has propagated it.
    created_at: float = field(default_factory=time.monotonic)
    policy: ResourcePolicy = field(default_factory=ResourcePolicy)

    def to_json(self, project: str) -> dict:
        body = {
            "name": f"projects/{project}/serviceAccounts/{self.email}",
            "projectId": project,
            "uniqueId": self.unique_id,
            "email": self.email,
            "etag": self.etag,
            "oauth2ClientId": self.unique_id,
        }
        # Zero values are omitted from the JSON, as the real front end does.
        if self.display_name:
            body["displayName"] = self.display_name
        if self.description:
            body["description"] = self.description
        if self.disabled:
            body["disabled"] = True
        return body


class Iam:
    """Service accounts of the sandbox project; other modules ask ``exists(email)`` through ``ctx.module("iam")``."""

    name = "iam"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.project_number = project_number(ctx.config)
        self.compute_default_email = f"{self.project_number}-compute@developer.gserviceaccount.com"
        self.accounts: dict[str, ServiceAccount] = {}  # by email
        self._unique_ids: set[str] = set()  # never reused, even after a delete (as on GCP)
        self._add(
            ServiceAccount(
                account_id=f"{self.project_number}-compute",
                email=self.compute_default_email,
                unique_id=self._new_unique_id(),
                display_name="Compute Engine default service account",
                created_at=float("-inf"),  # as old as the project: long propagated
            )
        )

    # Python API for other modules ---------------------------------------------------------------------------
    def exists(self, email: str) -> bool:
        """Whether the service account exists (disabled ones too); accepts a ``serviceAccount:`` member."""
        return email.removeprefix("serviceAccount:") in self.accounts

    def visible(self, email: str) -> bool:
        """Whether other APIs can see the account yet: it exists and IAM has propagated it.

        Service accounts are eventually consistent: an account created moments ago is not yet known to
        setIamPolicy elsewhere or to a Cloud Run deploy that names it, for ``iam_propagation_seconds`` of
        simulated time (Google's IAM docs, "Access change propagation": typically about 2 minutes, up to 7;
        terraform-provider-google issues 18024 and 16350, magic-modules PR 10813 which sleeps after create).
        The account's own GET answers at once (read-your-writes in this stand-in; the real IAM API's reads are
        eventually consistent too, which Terraform polls through, and the product never relies on either).
        """
        account = self.accounts.get(email.removeprefix("serviceAccount:"))
        if account is None:
            return False
        window = self.config.iam_propagation_seconds * self.config.time_scale
        return time.monotonic() - account.created_at >= window

    def missing_account(self, email: str) -> str | None:
        """The "does not exist" message IAM-aware APIs give for a policy member they cannot see, or None.

        Accounts of other projects and Google-managed agents are not known here and pass. Not modelled: a Google
        service agent (service-N@serverless-robot-prod..., ...) exists only once its API has been used, and naming
        one before would be refused the same way; the product grants no role to a service agent.
        """
        email = email.removeprefix("serviceAccount:")
        own = email.endswith(f"@{self.config.project}.iam.gserviceaccount.com") or email == self.compute_default_email
        if own and not self.visible(email):
            return f"Service account {email} does not exist."
        return None

    def get(self, email: str) -> dict | None:
        """The account's REST JSON (``disabled`` present only when true), or None."""
        account = self.accounts.get(email.removeprefix("serviceAccount:"))
        return account.to_json(self.config.project) if account else None

    def require_service_account(self, email: str) -> None:
        """Raise 400 as IAM does when a policy names an account of this project it cannot see (missing, or
        created too recently to have propagated: GoogleCloudPlatform/data-migration-tool issue 58 shows the
        same "Service account X does not exist." for a bucket binding made right after the create)."""
        message = self.missing_account(email)
        if message:
            raise invalid_argument(message)

    # Routing ------------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v1/projects/{project}/serviceAccounts"
        return [
            Route(base, self.list_accounts, methods=["GET"]),
            Route(base, self.create_account, methods=["POST"]),
            Route(f"{base}/{{account}}", self.get_account, methods=["GET"]),
            Route(f"{base}/{{account}}", self.account_method, methods=["POST"]),
            Route(f"{base}/{{account}}", self.patch_account, methods=["PATCH"]),
            Route(f"{base}/{{account}}", self.update_account, methods=["PUT"]),
            Route(f"{base}/{{account}}", self.delete_account, methods=["DELETE"]),
            Route(f"{base}/{{account}}/keys", self.create_key, methods=["POST"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [Route("/state", self.admin_state, methods=["GET"])]

    async def shutdown(self) -> None:
        pass

    # Helpers ------------------------------------------------------------------------------------------------
    def _new_unique_id(self) -> str:
        while True:
            unique_id = "1" + str(secrets.randbelow(10**20)).zfill(20)  # 21 digits, as GCP's
            if unique_id not in self._unique_ids:
                self._unique_ids.add(unique_id)
                return unique_id

    def _add(self, account: ServiceAccount) -> None:
        self.accounts[account.email] = account

    def _project(self, request: Request, permission: str, wildcard: bool = False) -> str:
        project = request.path_params["project"]
        if project == "-" and wildcard:
            return project
        if project not in (self.config.project, self.project_number):
            raise GoogleApiError(403, f"Permission '{permission}' denied on resource (or it may not exist).")
        return project

    def _account(self, request: Request, permission: str) -> tuple[ServiceAccount, str]:
        """The account named in the path (email or unique id) and the verb after ``:``, if any."""
        project = self._project(request, permission, wildcard=True)
        key, _, verb = request.path_params["account"].partition(":")
        account = self.accounts.get(key) or next((a for a in self.accounts.values() if a.unique_id == key), None)
        if account is None:
            if project == "-":
                # Documented: with the "-" wildcard a missing account answers 403, not 404.
                raise GoogleApiError(403, f"Permission '{permission}' denied on resource (or it may not exist).")
            raise not_found("Unknown service account")
        return account, verb

    # Handlers -----------------------------------------------------------------------------------------------
    async def create_account(self, request: Request) -> JSONResponse:
        self._project(request, "iam.serviceAccounts.create")
        body = await _json_body(request)
        account_id = str(body.get("accountId", ""))
        if not 6 <= len(account_id) <= 30:
            raise invalid_argument(f'The account ID "{account_id}" does not have a length between 6 and 30.')
        if not ACCOUNT_ID.match(account_id):
            raise invalid_argument(f"{account_id} does not match [a-z][a-z\\d\\-]*[a-z\\d].")
        spec = body.get("serviceAccount") or {}
        display_name, description = _checked_texts(spec)
        email = f"{account_id}@{self.config.project}.iam.gserviceaccount.com"
        if email in self.accounts:
            raise already_exists(
                f"Service account {account_id} already exists within project projects/{self.config.project}."
            )
        account = ServiceAccount(
            account_id=account_id,
            email=email,
            unique_id=self._new_unique_id(),
            display_name=display_name,
            description=description,
        )
        self._add(account)
        return JSONResponse(account.to_json(self.config.project))

    async def list_accounts(self, request: Request) -> JSONResponse:
        self._project(request, "iam.serviceAccounts.list")
        ordered = sorted(self.accounts.values(), key=lambda a: a.email)
        rows = [a.to_json(self.config.project) for a in ordered]
        return JSONResponse(offset_page(rows, "accounts", request.query_params, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE))

    async def get_account(self, request: Request) -> JSONResponse:
        account, verb = self._account(request, "iam.serviceAccounts.get")
        if verb:
            raise not_found(f"Method '{verb}' not found (use POST for :{verb}).")
        return JSONResponse(account.to_json(self.config.project))

    async def patch_account(self, request: Request) -> JSONResponse:
        account, _ = self._account(request, "iam.serviceAccounts.update")
        body = await _json_body(request)
        spec = body.get("serviceAccount") or {}
        mask_text = body.get("updateMask") or request.query_params.get("updateMask", "")
        mask = [p.strip() for p in str(mask_text).split(",") if p.strip()]
        if not mask:
            raise invalid_argument("Request contains an invalid argument: update_mask is required.")
        camel = [_camel(p) for p in mask]
        for path in camel:
            if path not in PATCHABLE:
                raise invalid_argument(f"Invalid update mask path '{path}': only displayName and description.")
        display_name, description = _checked_texts(spec)
        if "displayName" in camel:
            account.display_name = display_name
        if "description" in camel:
            account.description = description
        account.etag = base64.b64encode(secrets.token_bytes(8)).decode()
        return JSONResponse(account.to_json(self.config.project))

    async def update_account(self, request: Request) -> JSONResponse:
        """The deprecated PUT: the body is the account; only display name and description change."""
        account, _ = self._account(request, "iam.serviceAccounts.update")
        account.display_name, account.description = _checked_texts(await _json_body(request))
        account.etag = base64.b64encode(secrets.token_bytes(8)).decode()
        return JSONResponse(account.to_json(self.config.project))

    async def delete_account(self, request: Request) -> JSONResponse:
        account, _ = self._account(request, "iam.serviceAccounts.delete")
        del self.accounts[account.email]
        return JSONResponse({})

    async def account_method(self, request: Request) -> JSONResponse:
        verb = request.path_params["account"].partition(":")[2]
        permissions = {
            "getIamPolicy": "iam.serviceAccounts.getIamPolicy",
            "setIamPolicy": "iam.serviceAccounts.setIamPolicy",
            "testIamPermissions": "iam.serviceAccounts.get",
            "disable": "iam.serviceAccounts.disable",
            "enable": "iam.serviceAccounts.enable",
        }
        if verb not in permissions:
            raise not_found(f"Method '{verb or 'POST'}' not found.")
        account, _ = self._account(request, permissions[verb])
        body = await _json_body(request, allow_empty=True)
        if verb == "getIamPolicy":
            return JSONResponse(account.policy.to_json())
        if verb == "setIamPolicy":
            return JSONResponse(account.policy.set_from_request(body, self.require_service_account))
        if verb == "testIamPermissions":
            # What the caller holds on this account, through the project's policy and the account's own.
            name = f"projects/{self.config.project}/serviceAccounts/{account.email}"
            caller = authz.caller(self.ctx, request.scope)
            held = authz.held_permissions(self.ctx, caller, list(body.get("permissions") or []), name)
            return JSONResponse({"permissions": held} if held else {})
        account.disabled = verb == "disable"
        return JSONResponse({})

    async def create_key(self, request: Request) -> JSONResponse:
        """``serviceAccounts.keys.create``: a user-managed RSA key; ``privateKeyData`` is the key file, base64.

        The key file is what `gcloud iam service-accounts keys create` writes (IAM docs, "Create and delete service
        account keys": type, project_id, private_key_id, private_key, client_email, client_id, auth_uri, token_uri,
        ...). Its ``token_uri`` is the token endpoint that accepts the key's assertions: Google's name when the
        sandbox answers for it (its TLS face), else the control plane's own ``/token``.
        """
        account, _ = self._account(request, "iam.serviceAccountKeys.create")
        body = await _json_body(request, allow_empty=True)
        if body.get("privateKeyType", "TYPE_GOOGLE_CREDENTIALS_FILE") != "TYPE_GOOGLE_CREDENTIALS_FILE":
            raise invalid_argument("The sandbox makes keys of type TYPE_GOOGLE_CREDENTIALS_FILE only.")
        record, private_pem = self.ctx.identity.service_account_keys.create(account.email)
        key_file = {
            "type": "service_account",
            "project_id": self.config.project,
            "private_key_id": record.key_id,
            "private_key": private_pem,
            "client_email": account.email,
            "client_id": account.unique_id,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.ctx.token_uri or f"{self.ctx.control_url}/token",
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{account.email}",
            "universe_domain": "googleapis.com",
        }
        created = dt.datetime.now(dt.UTC)
        return JSONResponse(
            {
                "name": f"projects/{self.config.project}/serviceAccounts/{account.email}/keys/{record.key_id}",
                "privateKeyType": "TYPE_GOOGLE_CREDENTIALS_FILE",
                "privateKeyData": base64.b64encode(json.dumps(key_file, indent=2).encode()).decode(),
                "validAfterTime": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "validBeforeTime": "9999-12-31T23:59:59Z",
                "keyAlgorithm": "KEY_ALG_RSA_2048",
                "keyOrigin": "GOOGLE_PROVIDED",
                "keyType": "USER_MANAGED",
            }
        )

    # Admin ------------------------------------------------------------------------------------------------
    async def admin_state(self, _: Request) -> JSONResponse:
        return JSONResponse(
            {
                "project": self.config.project,
                "projectNumber": self.project_number,
                "computeDefaultServiceAccount": self.compute_default_email,
                "serviceAccounts": [
                    {**a.to_json(self.config.project), "policy": a.policy.to_json()}
                    for a in sorted(self.accounts.values(), key=lambda a: a.email)
                ],
            }
        )


async def _json_body(request: Request, allow_empty: bool = False) -> dict:
    raw = await request.body()
    if not raw.strip() and not allow_empty:
        raise invalid_argument("Request contains an invalid argument: the request body is empty.")
    return json_object(raw)


def _checked_texts(spec: dict) -> tuple[str, str]:
    display_name = str(spec.get("displayName", "") or "")
    description = str(spec.get("description", "") or "")
    if len(display_name.encode()) > MAX_DISPLAY_NAME_BYTES:
        raise invalid_argument(f"displayName is longer than {MAX_DISPLAY_NAME_BYTES} bytes.")
    if len(description.encode()) > MAX_DESCRIPTION_BYTES:
        raise invalid_argument(f"description is longer than {MAX_DESCRIPTION_BYTES} bytes.")
    return display_name, description


def _camel(path: str) -> str:
    head, *rest = path.split("_")
    return head + "".join(p.capitalize() for p in rest)
