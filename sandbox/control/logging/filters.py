"""The part of the Logging query language that reading Cloud Run revision logs needs.

Supported: comparisons on ``resource.type``, ``resource.labels.<label>``, ``labels."<key>"`` (an entry's own
labels, such as a job's ``labels."run.googleapis.com/execution_name"``) and ``logName`` (``=`` only),
``severity``, ``timestamp`` and ``httpRequest.status`` (a request log's, e.g. ``httpRequest.status=429``) (``=``,
``>``, ``>=``, ``<``, ``<=``), and ``logName:"text"`` (the has operator: the log name contains the text, case aside:
"String comparisons aren't case sensitive", Logging query language docs; e.g. ``logName:"varlog"`` for Cloud Run's
system log), joined by the keyword ``AND`` (upper case, as the real grammar requires) or by whitespace and newlines (an
implicit AND, as on GCP). Values may be quoted (``"..."`` with backslash escapes) or bare. Anything else (``OR``,
``NOT``, ``:`` on other fields, ``!=``, parentheses, other fields) is refused with 400 INVALID_ARGUMENT naming the
clause: a stand-in that silently ignored part of a filter would return logs the real API would not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import timestamp_pb2

from sandbox.control.errors import GoogleApiError, invalid_argument

# google.logging.type.LogSeverity
SEVERITIES = {
    "DEFAULT": 0,
    "DEBUG": 100,
    "INFO": 200,
    "NOTICE": 300,
    "WARNING": 400,
    "ERROR": 500,
    "CRITICAL": 600,
    "ALERT": 700,
    "EMERGENCY": 800,
}
# cloud_run_revision's labels, and cloud_run_job's (job_name, location, project_id).
RESOURCE_LABELS = ("service_name", "revision_name", "location", "configuration_name", "project_id", "job_name")
ORDERED_OPS = {
    "=": lambda a, b: a == b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}
# What a clause may compare with: the ordered comparisons, and the has operator (logName only).
OPS = {**ORDERED_OPS, ":": lambda a, b: str(b).lower() in str(a).lower()}

_CLAUSE = re.compile(
    r'(?P<field>labels\."[^"\n]+"|labels\.[\w./-]+|[A-Za-z_][\w.]*)'
    r'\s*(?P<op>>=|<=|!=|=~|!~|=|>|<|:)\s*(?P<value>"(?:[^"\\\n]|\\.)*"|[^\s"()]+)'
)
_AND = re.compile(r"AND(?=\s)")
SUPPORTED = (
    'resource.type="...", resource.labels.<label>="...", labels."<key>"="...", logName="...", logName:"...", '
    'severity>=LEVEL, timestamp>="RFC 3339" and httpRequest.status=CODE, joined with AND'
)


@dataclass(frozen=True)
class Clause:
    """One ``field op value`` comparison, already checked and converted for matching."""

    text: str
    field: str
    op: str
    value: str | int


def parse(text: str) -> list[Clause]:
    """The clauses of ``text`` (all must hold); raises 400 for anything outside the supported subset."""
    clauses: list[Clause] = []
    pos, end = 0, len(text)
    while True:
        pos = _skip_space(text, pos)
        if pos >= end:
            return clauses
        if clauses:
            joined = _AND.match(text, pos)
            if joined:
                pos = _skip_space(text, joined.end())
                if pos >= end:
                    raise _unsupported("AND", "AND must be followed by another comparison")
        match = _CLAUSE.match(text, pos)
        if match is None or (match.end() < end and not text[match.end()].isspace()):
            raise _unsupported(_segment(text, pos), "not a comparison the sandbox understands")
        clauses.append(_clause(match))
        pos = match.end()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _segment(text: str, pos: int) -> str:
    """The rest of the clause that failed to parse, up to the next line or ``AND``, for the error message."""
    rest = text[pos:].split("\n", 1)[0]
    return re.split(r"\sAND\s", rest, maxsplit=1)[0].strip() or rest.strip()


def _unsupported(clause: str, why: str) -> GoogleApiError:
    return invalid_argument(f"Unsupported filter clause '{clause}': {why}. The sandbox supports {SUPPORTED}.")


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return re.sub(r"\\(.)", r"\1", raw[1:-1])
    return raw


def _clause(match: re.Match[str]) -> Clause:
    text, field, op = match.group(0), match.group("field"), match.group("op")
    value = _unquote(match.group("value"))
    is_label = field.startswith("resource.labels.") and field.removeprefix("resource.labels.") in RESOURCE_LABELS
    if field.startswith("labels."):
        if op != "=":
            raise _unsupported(text, f"only '=' is supported on {field}")
        return Clause(text, "labels." + _unquote(field.removeprefix("labels.")), op, value)
    if field == "logName":
        if op not in ("=", ":"):
            raise _unsupported(text, f"only '=' and ':' are supported on {field}")
        return Clause(text, field, op, value)
    if field == "resource.type" or is_label:
        if op != "=":
            raise _unsupported(text, f"only '=' is supported on {field}")
        return Clause(text, field, op, value)
    if field == "severity":
        if op not in ORDERED_OPS:
            raise _unsupported(text, f"operator '{op}' is not supported on severity")
        level = SEVERITIES.get(value.upper()) if not value.isdigit() else int(value)
        if level is None:
            raise invalid_argument(f"Invalid severity '{value}' in filter clause '{text}'.")
        return Clause(text, field, op, level)
    if field == "timestamp":
        if op not in ORDERED_OPS:
            raise _unsupported(text, f"operator '{op}' is not supported on timestamp")
        stamp = timestamp_pb2.Timestamp()
        try:
            stamp.FromJsonString(value)
        except ValueError:
            raise invalid_argument(
                f"Invalid timestamp '{value}' in filter clause '{text}': use RFC 3339, e.g. 2024-05-01T12:00:00Z."
            ) from None
        return Clause(text, field, op, stamp.ToNanoseconds())
    if field == "httpRequest.status":
        if op not in ORDERED_OPS:
            raise _unsupported(text, f"operator '{op}' is not supported on {field}")
        if not value.isdigit():
            raise invalid_argument(f"Invalid status '{value}' in filter clause '{text}': an HTTP status code.")
        return Clause(text, field, op, int(value))
    raise _unsupported(text, f"field '{field}' is not supported")


def matcher(clauses: list[Clause], fields: Callable[[str], str | int | None]) -> bool:
    """Whether an entry whose field values ``fields`` returns satisfies every clause (a field it lacks, None,
    satisfies none)."""
    return all((value := fields(c.field)) is not None and OPS[c.op](value, c.value) for c in clauses)
