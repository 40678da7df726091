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
import secrets
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
        self.access_tokens = AccessTokens()
        self.service_account_keys = ServiceAccountKeys()

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


class AccessTokens:
    """OAuth access tokens the sandbox handed out, and whom each speaks for.

    Google's APIs act as the principal a bearer token was issued to. The sandbox's clients mostly send no token (the
    anonymous target) or one from the metadata server of the host the pipeline runs on: both act as the configured
    caller (``SandboxConfig.caller``, which tests change as they go). A token issued for a named account (by the
    token endpoint for a service-account key, or by a Cloud Run job's metadata server) acts as that account, so a
    job running as an account without a role is refused as it would be on Google Cloud.
    """

    def __init__(self) -> None:
        self._principals: dict[str, str | None] = {}

    def mint(self, principal: str | None = None) -> str:
        """A new opaque token for ``principal`` (None: whoever the configured caller is when it is used)."""
        token = f"ya29.sandbox-{secrets.token_urlsafe(24)}"
        self._principals[token] = principal
        return token

    def principal(self, token: str) -> str | None:
        """The principal ``token`` was issued to; None for the configured caller's tokens and unknown ones."""
        return self._principals.get(token)

    def issued(self, token: str) -> bool:
        """Whether the sandbox handed ``token`` out (to anyone)."""
        return token in self._principals


@dataclass(frozen=True)
class ServiceAccountKey:
    """A user-managed key of a service account: its id, the account, and the public half that checks assertions."""

    key_id: str
    email: str
    public_pem: str


# Google's token endpoint's words (invalid_grant) for an assertion it cannot read as a valid, current JWT, as
# googleapis/google-api-php-client issues 1429 and 1501 and fastlane issue 14972 quote them.
NOT_A_JWT = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and "
    "exp values and use a clock with skew to account for clock differences between systems."
)


class ServiceAccountKeys:
    """Keys made by IAM's ``serviceAccounts.keys.create``, for the token endpoint's JWT-bearer grant."""

    def __init__(self) -> None:
        self.keys: dict[str, ServiceAccountKey] = {}

    def create(self, email: str) -> tuple[ServiceAccountKey, str]:
        """A new RSA 2048 key for ``email``: the record kept here, and the private key PEM (given out once)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        public_pem = (
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
        record = ServiceAccountKey(secrets.token_hex(20), email, public_pem)
        self.keys[record.key_id] = record
        return record, private_pem

    def verify_assertion(self, assertion: str) -> str:
        """The account email a signed JWT assertion speaks for; ValueError with the OAuth error text otherwise."""
        return str(self.assertion_claims(assertion)["iss"])

    def assertion_claims(self, assertion: str) -> dict:
        """The claims of a JWT signed by one of these keys for its own account; ValueError otherwise."""
        try:
            header = jwt.decode_header(assertion)
        except (ValueError, exceptions.GoogleAuthError):
            raise ValueError(NOT_A_JWT) from None
        key = self.keys.get(str(header.get("kid", "")))
        if key is None:
            raise ValueError("Invalid JWT Signature.")
        try:
            payload = jwt.decode(assertion, certs={key.key_id: key.public_pem}, verify=True)
        except (exceptions.GoogleAuthError, ValueError):
            raise ValueError("Invalid JWT Signature.") from None
        if payload.get("iss") != key.email:
            raise ValueError("Invalid JWT Signature.")  # the key does not belong to the account it claims
        return payload
