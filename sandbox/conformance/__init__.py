"""Conformance of every control-plane call to Google's published discovery documents.

- Request side (``ConformanceMiddleware``): an unknown path or method is answered with the Google front end's
  404 page; an unknown query parameter, an unknown body field at any depth or an enum value outside the
  schema is answered 400 INVALID_ARGUMENT with Google's "Invalid JSON payload received. ..." message and a
  ``google.rpc.BadRequest`` detail, exactly as the real API refuses it.
- Response side: every 2xx JSON answer of a matched method is checked against the method's response schema
  (operations' ``Any`` payloads against the schema their ``@type`` names); violations are recorded in a
  ``ConformanceLog`` (``GET /_sandbox/conformance``) and fail the test session.

Paths under ``/_sandbox`` are the sandbox's own. A sandbox endpoint that is not a Google API (a metadata
server, an OAuth token endpoint) must register its prefix with ``exempt_prefix("/computeMetadata/")``;
otherwise the control plane answers it 404 as Google's front end would.
"""

from sandbox.conformance.middleware import ConformanceLog, ConformanceMiddleware, exempt_prefix, is_exempt
from sandbox.conformance.request import body_problems, query_problems
from sandbox.conformance.schema import Problem, walker

__all__ = [
    "ConformanceLog",
    "ConformanceMiddleware",
    "Problem",
    "body_problems",
    "exempt_prefix",
    "is_exempt",
    "query_problems",
    "walker",
]
