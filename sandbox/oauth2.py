"""Google's OAuth 2.0 token endpoint (``POST /token``), for service-account keys made by the IAM stand-in.

google-auth's service-account credentials sign a JWT with the key and POST it to the key file's ``token_uri``
(``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=JWT``; Google's "Using OAuth 2.0 for Server to
Server Applications", "Making the access token request"). The answer is ``{"access_token", "expires_in": 3599,
"token_type": "Bearer"}``; a bad assertion is a 400 ``{"error": "invalid_grant", "error_description": ...}`` with
Google's texts ("Invalid JWT Signature.", as in googleapis/google-auth-library-python issues about revoked keys).
The token acts as the key's account on every sandbox API (sandbox.authz.caller). An assertion with a
``target_audience`` claim gets a signed ID token for that audience instead (``{"id_token": ...}``), as Google's
endpoint answers service-account ID token requests.

Served on the control plane, and as ``https://oauth2.googleapis.com/token`` through the TLS face (sandbox/tls.py).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.conformance.middleware import exempt_prefix
from sandbox.identity import TokenIssuer

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ACCESS_TOKEN_LIFETIME_S = 3599
TOKEN_PATH = "/token"
exempt_prefix(TOKEN_PATH)  # not a discovery-described REST API: the conformance middleware lets it through


def token_routes(issuer: TokenIssuer) -> list[BaseRoute]:
    async def token(request: Request) -> JSONResponse:
        form = dict(parse_qsl((await request.body()).decode("latin-1")))
        if form.get("grant_type") != JWT_BEARER:
            return _error("unsupported_grant_type", "Invalid grant_type: " + form.get("grant_type", ""))
        try:
            claims = issuer.service_account_keys.assertion_claims(form.get("assertion", ""))
        except ValueError as exc:
            return _error("invalid_grant", str(exc))
        email = str(claims["iss"])
        if claims.get("target_audience"):
            # An ID token for a private service: google-auth's IDTokenCredentials ask with a ``target_audience``
            # claim and read ``id_token`` from the answer (google/oauth2/_client.py, id_token_jwt_grant).
            return JSONResponse({"id_token": issuer.mint(email, str(claims["target_audience"]))})
        access_token = issuer.access_tokens.mint(f"serviceAccount:{email}")
        return JSONResponse(
            {"access_token": access_token, "expires_in": ACCESS_TOKEN_LIFETIME_S, "token_type": "Bearer"}
        )

    return [Route(TOKEN_PATH, token, methods=["POST"])]


def _error(code: str, description: str) -> JSONResponse:
    return JSONResponse({"error": code, "error_description": description}, status_code=400)
