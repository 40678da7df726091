"""The answers Google's front ends give to requests refused for their shape."""

from __future__ import annotations

import html
import json

from sandbox.conformance.schema import Problem

# Compute and Storage still add the legacy ``errors`` list to their JSON errors (reason "invalid" for a payload
# the transcoder refused, as in the Gemini API errors quoted in danny-avila/LibreChat#11761).
_LEGACY_ERRORS_APIS = frozenset({"compute.v1", "storage.v1"})


def bad_request_body(api: str, problems: list[Problem], messages: list[str] | None = None) -> bytes:
    """400 INVALID_ARGUMENT with one ``google.rpc.BadRequest`` field violation per problem.

    Shape as the real front end sends it (zed-industries/zed#62539, decolua/9router#1876): the messages joined
    by newlines, and ``details[0].fieldViolations`` with ``field`` (omitted for the body's top level) and
    ``description``.
    """
    violations: list[dict[str, str]] = []
    for problem in problems:
        violation = {"field": problem.path} if problem.path else {}
        violations.append({**violation, "description": problem.message})
    for message in messages or []:
        violations.append({"description": message})
    text = "\n".join(v["description"] for v in violations)
    error: dict = {"code": 400, "message": text, "status": "INVALID_ARGUMENT"}
    if api in _LEGACY_ERRORS_APIS:
        error["errors"] = [{"message": text, "domain": "global", "reason": "invalid"}]
    error["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": violations}]
    return json.dumps({"error": error}).encode()


def not_found_page(path: str) -> bytes:
    """The Google front end's plain 404 page for a URL no API serves (an HTML page titled
    "Error 404 (Not Found)!!1", google/google-visualization-issues#2593; "The requested URL ... was not found
    on this server. That's all we know.", validator/validator#2035)."""
    return (
        "<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n"
        '  <meta name=viewport content="initial-scale=1, minimum-scale=1, width=device-width">\n'
        "  <title>Error 404 (Not Found)!!1</title>\n"
        "  <a href=//www.google.com/><span id=logo aria-label=Google></span></a>\n"
        "  <p><b>404.</b> <ins>That\u2019s an error.</ins>\n"
        f"  <p>The requested URL <code>{html.escape(path)}</code> was not found on this server."
        "  <ins>That\u2019s all we know.</ins>\n"
    ).encode()
