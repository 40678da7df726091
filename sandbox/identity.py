"""Google-signed ID tokens, sandbox edition: an RS256 key made at start, tokens minted and verified with it.

The metadata server stand-in (sandbox/metadata.py) mints them; Cloud Run's front ends (control/run/frontend.py)
verify them. The claims are those Google's metadata server puts in an ID token ("Verifying the identity of
instances" / "Get an ID token", Compute Engine docs): ``iss`` https://accounts.google.com, ``aud`` the requested
audience, ``azp`` and ``sub`` the service account's unique id, ``iat``, ``exp`` one hour later, and with
``format=full`` also ``email`` and ``email_verified``. Signing and checking use google-auth's own JWT code, the
same that verifies real Google tokens.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt, exceptions, jwt

ISSUER = "https://accounts.google.com"
TOKEN_LIFETIME_S = 3600  # metadata server ID tokens live one hour


@dataclass(frozen=True)
class Claims:
    """What a front end needs from a verified token."""

    audience: str
    email: str

    @property
    def principal(self) -> str:
        """The IAM member the token speaks for ("serviceAccount:..." for a service account, else "user:...")."""
        kind = "serviceAccount" if self.email.endswith(".gserviceaccount.com") else "user"
        return f"{kind}:{self.email}"


def unique_id(email: str) -> str:
    """A stable 21-digit numeric id per account, as Google gives every service account (``sub``, ``azp``)."""
    return str(int(hashlib.sha256(email.encode()).hexdigest(), 16))[:21]


class TokenIssuer:
    """One signing key per sandbox; another key (a forged token) never verifies."""

    def __init__(self) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = hashlib.sha1(key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )).hexdigest()  # fmt: skip
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._signer = crypt.RSASigner.from_string(pem, key_id=self.key_id)
        self.public_pem = (
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    def mint(self, email: str, audience: str, full: bool = True, now: float | None = None) -> str:
        """An ID token for ``email`` with ``aud`` = ``audience``."""
        issued = int(now if now is not None else time.time())
        subject = unique_id(email)
        payload: dict = {
            "aud": audience,
            "azp": subject,
            "exp": issued + TOKEN_LIFETIME_S,
            "iat": issued,
            "iss": ISSUER,
            "sub": subject,
        }
        if full:
            payload |= {"email": email, "email_verified": True}
        return jwt.encode(self._signer, payload).decode()

    def verify(self, token: str) -> Claims | None:
        """The token's claims if this sandbox signed it, it has not expired and it names an issuer and email."""
        try:
            payload = jwt.decode(token, certs={self.key_id: self.public_pem}, verify=True)
        except (exceptions.GoogleAuthError, ValueError):
            return None  # bad signature, another key, expired, or not a JWT at all
        if payload.get("iss") not in (ISSUER, "accounts.google.com") or not payload.get("email"):
            return None
        return Claims(audience=str(payload.get("aud", "")), email=str(payload["email"]))
