"""ASGI middleware that answers 403 before the API handler runs when the caller lacks the method's permission.

Each request is routed to its discovery method (``sandbox.discovery.match``), as the real front end routes it;
the permission and resource come from ``sandbox.authz.methods`` and are checked against the project's and the
resource's IAM policies (``sandbox.authz.has_permission``) for the configured caller. Requests for other projects
pass through untouched: the API modules already answer those as Google does for a project you cannot see.
Admin paths (``/_sandbox``) and requests no discovery method routes are not checked.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from sandbox import authz, discovery
from sandbox.asgi import buffer_body, send_response
from sandbox.authz.denials import denial, unauthenticated
from sandbox.authz.methods import READS_BODY, Check, extra_checks, permission_for, resource_for, upload_object_name
from sandbox.authz.propagation import bindings_of, policy_key


class AuthzMiddleware:
    """Permission checks for the APIs in ``apis`` (discovery names such as "run.v2"); all served ones if None."""

    def __init__(self, app, ctx, apis: tuple[str, ...] | None = None) -> None:
        self.app = app
        self._ctx = ctx  # a ControlContext, or a callable returning it (the GCS front starts before the context)
        self.apis = apis or tuple(a for a in discovery.SERVED_APIS if a != "storage.v1")

    @property
    def routes(self) -> list:
        """The wrapped app's routes (the conformance middleware outside looks them up)."""
        return getattr(self.app, "routes", [])

    @property
    def ctx(self):
        return self._ctx() if callable(self._ctx) else self._ctx

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_sandbox"):
            await self.app(scope, receive, send)
            return
        raw_path = scope.get("raw_path") or scope["path"].encode()
        match = discovery.match(scope["method"], raw_path.decode("latin-1").split("?", 1)[0], self.apis)
        if match is not None and authz.unknown_token(self.ctx, scope):
            storage = match.method.api.startswith("storage")
            await send_response(
                send, 401, json.dumps(unauthenticated(storage)).encode(), b"application/json; charset=UTF-8"
            )
            return
        permission = permission_for(match.id) if match else None
        if match is None or (permission is None and match.id not in READS_BODY):
            await self.app(scope, receive, send)
            return
        body: dict = {}
        if match.id in READS_BODY:
            raw, receive = await buffer_body(receive)
            try:
                parsed = json.loads(raw) if raw.strip() else {}
                body = parsed if isinstance(parsed, dict) else {}
            except ValueError:
                body = {}  # malformed JSON: the API itself answers 400
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if match.id == "storage.objects.insert" and "name" not in query:
            # The object is named in the body: its name is what an object-name condition is judged on.
            raw, receive = await buffer_body(receive)
            query["name"] = upload_object_name(raw) or ""
        config = self.ctx.config
        resource = resource_for(match, query, body, config.project)
        if not _own_project(self.ctx, resource):
            await self.app(scope, receive, send)
            return
        checks = [Check(permission, resource)] if permission else []
        checks += extra_checks(match, body, config.project, str(config.project_number))
        principal = authz.caller(self.ctx, scope)
        for check in checks:
            if not authz.has_permission(self.ctx, principal, check.permission, check.resource):
                answer = json.dumps(denial(match.method.api.split(".")[0], check, principal)).encode()
                await send_response(send, 403, answer, b"application/json; charset=UTF-8")
                return
        if match.id.endswith(".setIamPolicy"):
            await self._recording_grants(resource, scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _recording_grants(self, resource: str, scope, receive, send) -> None:
        """A setIamPolicy call: the bindings it adds take effect later (sandbox.authz.propagation)."""
        key = policy_key(resource)
        read = (lambda: authz.project_policy(self.ctx)) if key == "project" else (
            lambda: authz.resource_policy(self.ctx, resource))  # fmt: skip
        before = bindings_of(read())
        status: list[int] = []

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, sending)
        if status and status[0] == 200:
            self.ctx.grants.record(key, before, bindings_of(read()))


def _own_project(ctx, resource: str) -> bool:
    parts = resource.split("/")
    if len(parts) < 2 or parts[0] != "projects":
        return True  # no project in the name (e.g. a logging scope): the sandbox's own
    return authz.is_own_project(ctx, parts[1])
