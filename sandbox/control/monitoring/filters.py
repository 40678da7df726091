"""Monitoring filters (https://cloud.google.com/monitoring/api/v3/filters), the part timeSeries.list needs here.

Selectors: ``metric.type``, ``resource.type``, ``project``, ``metric.label[s].KEY``, ``resource.label[s].KEY``
compared with ``=`` or ``!=`` to a quoted (or bare) string, or to ``one_of(...)``, ``starts_with(...)``,
``ends_with(...)``, ``has_substring(...)`` and ``monitoring.regex.full_match(...)``; clauses joined by ``AND`` or by
adjacency (a newline), as the filters page shows. ``OR`` and ``NOT`` are refused (400) rather than guessed at.

A list filter "must specify a single metric type" (timeSeries.list reference): exactly one ``metric.type = "..."``.
Errors read as Monitoring's do: ``Field filter had an invalid value of "FILTER": REASON`` (Monitoring API
troubleshooting page: 400 INVALID_ARGUMENT with "Field filter had an invalid value"); the reason for a missing
metric type follows the alert-policy message "must specify a restriction on "resource.type" in the filter"
(terraform-provider-google issue 4165); an unknown metric type is 404 "Cannot find metric(s) that match type =
"T". If a metric was created recently, it could take up to 10 minutes to become available." (as quoted by users
of timeSeries.list and alert policies on GitHub).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sandbox.control.errors import GoogleApiError, invalid_argument

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>!=|=|\(|\)|,)|(?P<word>[A-Za-z0-9_./\-:*]+))')
_FUNCTIONS = {"one_of", "starts_with", "ends_with", "has_substring", "monitoring.regex.full_match"}
_SELECTOR = re.compile(r"^(metric\.type|resource\.type|project|(?:metric|resource)\.labels?\.[A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class Clause:
    field: str  # normalised: "metric.type", "resource.type", "project", "metric.labels.k", "resource.labels.k"
    negated: bool
    test: Callable[[str], bool]


@dataclass(frozen=True)
class Filter:
    metric_type: str
    clauses: tuple[Clause, ...]

    def matches(self, value_of: Callable[[str], str | None]) -> bool:
        for clause in self.clauses:
            value = value_of(clause.field)
            hit = value is not None and clause.test(value)
            if hit == clause.negated:
                return False
        return True


def _bad(text: str, reason: str) -> GoogleApiError:
    return invalid_argument(f'Field filter had an invalid value of "{text}": {reason}')


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1]) if token.startswith('"') else token


def _tokens(text: str) -> list[str]:
    found, pos = [], 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise _bad(text, f"Unexpected character at position {pos}.")
        found.append(match.group(match.lastgroup))
        pos = match.end()
    return found


def _normalise(selector: str) -> str:
    return re.sub(r"^(metric|resource)\.label\.", r"\1.labels.", selector)


def _test(name: str, args: list[str]) -> Callable[[str], bool]:
    if name == "one_of":
        return lambda v: v in args
    if len(args) != 1:
        raise ValueError(f"{name} takes one argument")
    arg = args[0]
    if name == "starts_with":
        return lambda v: v.startswith(arg)
    if name == "ends_with":
        return lambda v: v.endswith(arg)
    if name == "has_substring":
        return lambda v: arg in v
    pattern = re.compile(arg)
    return lambda v: pattern.fullmatch(v) is not None


def parse(text: str, known_types: Mapping[str, object]) -> Filter:
    """The filter of a timeSeries.list call; 400 for what Monitoring would refuse, 404 for an unknown metric."""
    tokens = _tokens(text)
    clauses: list[Clause] = []
    metric_types: list[str] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if word.upper() == "AND" and clauses:
            i += 1
            continue
        if word.upper() in ("OR", "NOT") or word == "-":
            raise _bad(text, f"The sandbox supports filters joined by AND only, not {word}.")
        if not _SELECTOR.match(word):
            raise _bad(text, f"Unknown selector or malformed restriction at '{word}'.")
        field, op = _normalise(word), tokens[i + 1] if i + 1 < len(tokens) else ""
        if op not in ("=", "!="):
            raise _bad(text, f"Expected = or != after {word}.")
        i += 2
        if i >= len(tokens):
            raise _bad(text, f"Missing value for {word}.")
        value = tokens[i]
        if value in _FUNCTIONS and i + 1 < len(tokens) and tokens[i + 1] == "(":
            args, i = [], i + 2
            while i < len(tokens) and tokens[i] != ")":
                if tokens[i] != ",":
                    args.append(_unquote(tokens[i]))
                i += 1
            if i >= len(tokens):
                raise _bad(text, f"Unclosed {value}(.")
            try:
                test = _test(value, args)
            except (ValueError, re.error) as exc:
                raise _bad(text, str(exc)) from None
        elif value in ("=", "!=", "(", ")", ","):
            raise _bad(text, f"Missing value for {word}.")
        else:
            literal = _unquote(value)
            test = literal.__eq__
            if field == "metric.type" and op == "=":
                metric_types.append(literal)
        i += 1
        clauses.append(Clause(field, op == "!=", test))
    if len(metric_types) != 1:
        reason = 'must specify a restriction on "metric.type" in the filter' if not metric_types else (
            "The filter must specify a single metric type.")  # fmt: skip
        raise _bad(text, reason)
    if metric_types[0] not in known_types:
        raise GoogleApiError(
            404,
            f'Cannot find metric(s) that match type = "{metric_types[0]}". If a metric was created recently, it '
            "could take up to 10 minutes to become available.",
        )
    return Filter(metric_types[0], tuple(clauses))
