"""ID tokens for calling private sandbox services in tests, minted the way the product mints them.

google-auth's ``fetch_id_token`` asks the metadata server, which tests/conftest.py points at the session
sandbox (sandbox/metadata.py); the token is signed by the sandbox's key and names the sandbox's caller.
"""

from __future__ import annotations

import google.auth.transport.requests
import google.oauth2.id_token


def id_token(audience: str) -> str:
    """A Google-signed (sandbox-signed) ID token with ``aud`` = ``audience``."""
    return google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), audience)


def bearer(audience: str) -> dict[str, str]:
    """The Authorization header Cloud Run expects: an ID token for the service URL (also when calling a tag URL)."""
    return {"Authorization": f"Bearer {id_token(audience)}"}
