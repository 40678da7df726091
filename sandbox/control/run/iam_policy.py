"""The IAM policy methods every Cloud Run resource has (services and jobs): getIamPolicy, setIamPolicy (with its etag
check and members IAM must know), testIamPermissions (what the caller holds through the project's policy and the
resource's own; sandbox.authz)."""

from __future__ import annotations

import base64
import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse

from sandbox import authz
from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, invalid_argument, not_found


def new_policy() -> dict:
    return {"version": 1, "etag": "ACAB", "bindings": []}


def set_policy(ctx: ControlContext, current: dict, body: dict) -> dict:
    """The policy ``body`` sets over ``current``; 409 on a stale etag, 400 naming a member IAM cannot see."""
    policy = body.get("policy", {})
    if policy.get("etag") and policy["etag"] != current["etag"]:
        raise GoogleApiError(
            409,
            "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.",
            "ABORTED",
        )
    iam = ctx.module("iam")
    for binding in policy.get("bindings", []):
        for member in binding.get("members", []):
            # A new account is unknown here until IAM has propagated it (sandbox/control/iam, visible()).
            missing = iam.missing_account(member) if iam and member.startswith("serviceAccount:") else None
            if missing:
                raise invalid_argument(missing)
    return {
        "version": policy.get("version", 1),
        "etag": base64.b64encode(secrets.token_bytes(8)).decode(),
        "bindings": [b for b in policy.get("bindings", []) if b.get("members")],
    }


async def post_policy_method(ctx: ControlContext, request: Request, verb: str, holder, resource: str) -> JSONResponse:
    """``:setIamPolicy`` or ``:testIamPermissions`` on ``holder`` (with a ``policy`` dict), named ``resource``."""
    body = await request.json()
    if verb == "setIamPolicy":
        holder.policy = set_policy(ctx, holder.policy, body)
        return JSONResponse(holder.policy)
    if verb == "testIamPermissions":
        caller = authz.caller(ctx, request.scope)
        held = authz.held_permissions(ctx, caller, list(body.get("permissions") or []), resource)
        return JSONResponse({"permissions": held} if held else {})
    raise not_found(f"Method '{verb or 'POST'}' not found.")
