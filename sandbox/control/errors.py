"""Google API errors as the real REST front ends return them.

``{"error": {"code": 404, "message": "...", "status": "NOT_FOUND"}}``; google-api-core maps the HTTP status
to its exception class and keeps the message.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}

# gRPC codes carried inside long-running operation errors.
GRPC_CODES = {
    "INVALID_ARGUMENT": 3,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


class GoogleApiError(Exception):
    """Raised by control-plane handlers; rendered as the JSON error the real API sends.

    ``reason`` adds the ``errors: [{message, domain, reason}]`` list that Compute and Storage send
    (e.g. "alreadyExists", "resourceInUseByAnotherResource").
    """

    def __init__(
        self,
        code: int,
        message: str,
        status: str | None = None,
        reason: str | None = None,
        details: list[dict] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS_NAMES.get(code, "UNKNOWN")
        self.reason = reason
        self.details = details  # google.rpc detail messages, each with its "@type"

    def body(self) -> dict:
        error: dict = {"code": self.code, "message": self.message, "status": self.status}
        if self.reason:
            error["errors"] = [{"message": self.message, "domain": "global", "reason": self.reason}]
        if self.details:
            error["details"] = self.details
        return {"error": error}


def invalid_argument(message: str) -> GoogleApiError:
    return GoogleApiError(400, message)


def not_found(message: str) -> GoogleApiError:
    return GoogleApiError(404, message)


def already_exists(message: str) -> GoogleApiError:
    return GoogleApiError(409, message, "ALREADY_EXISTS")


def aborted(message: str) -> GoogleApiError:
    return GoogleApiError(409, message, "ABORTED")


def failed_precondition(message: str) -> GoogleApiError:
    return GoogleApiError(400, message, "FAILED_PRECONDITION")


def google_error_body(code: int, message: str, status: str | None = None) -> bytes:
    status = status or STATUS_NAMES.get(code, "UNKNOWN")
    return json.dumps({"error": {"code": code, "message": message, "status": status}}).encode()


async def google_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GoogleApiError)
    return JSONResponse(exc.body(), status_code=exc.code)
