"""Compute Engine JSON and rules that do not depend on stored state: names, CIDR ranges, links, list filters.

Compute speaks camelCase JSON with string enums, numeric ids as strings, RFC 3339 timestamps, and errors
that carry an ``errors: [{reason}]`` list; the helpers here produce those shapes and the messages real
Compute sends.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import secrets
from datetime import UTC, datetime

from sandbox.control.errors import GoogleApiError

# RFC 1035 names, as Compute enforces them for networks and subnetworks (its own message quotes this regex).
NAME_PATTERN = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
NAME = re.compile(f"^{NAME_PATTERN}$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
ROUTING_MODES = ("REGIONAL", "GLOBAL")
MTU_MIN, MTU_MAX, MTU_DEFAULT = 1300, 8896, 1460
SUBNET_PURPOSES = (
    "PRIVATE",
    "PRIVATE_RFC_1918",
    "PRIVATE_NAT",
    "PRIVATE_SERVICE_CONNECT",
    "REGIONAL_MANAGED_PROXY",
    "GLOBAL_MANAGED_PROXY",
    "INTERNAL_HTTPS_LOAD_BALANCER",
    "PEER_MIGRATION",
)
# A primary IPv4 range must hold at least 8 addresses (Compute reserves 4 of them).
MAX_PREFIX_LENGTH = 29
# Networks a subnet body may name: a full or partial URL, or a bare name.
NETWORK_REF = re.compile(r"^(?:.*/)?(?:projects/(?P<project>[^/]+)/)?global/networks/(?P<name>[^/]+)$")


# Errors -----------------------------------------------------------------------------------------------------
def not_found(path: str) -> GoogleApiError:
    return GoogleApiError(404, f"The resource '{path}' was not found", reason="notFound")


def already_exists(path: str) -> GoogleApiError:
    return GoogleApiError(409, f"The resource '{path}' already exists", reason="alreadyExists")


def invalid(message: str) -> GoogleApiError:
    return GoogleApiError(400, message, reason="invalid")


def invalid_field(field: str, value: object, why: str) -> GoogleApiError:
    """Compute's wording for a bad request field: ``Invalid value for field 'resource.x': 'v'. Why.``"""
    shown = str(value).lower() if isinstance(value, bool) else value
    return invalid(f"Invalid value for field '{field}': '{shown}'. {why}")


def required(field: str) -> GoogleApiError:
    return GoogleApiError(400, f"Required field '{field}' not specified", reason="required")


def forbidden(permission: str, path: str) -> GoogleApiError:
    return GoogleApiError(403, f"Required '{permission}' permission for '{path}'", reason="forbidden")


def stale_fingerprint() -> GoogleApiError:
    return GoogleApiError(
        412, "Supplied fingerprint does not match current metadata fingerprint.", reason="conditionNotMet"
    )


def in_use(kind: str, path: str, user: str) -> GoogleApiError:
    return GoogleApiError(
        400,
        f"The {kind} resource '{path}' is already being used by '{user}'",
        reason="resourceInUseByAnotherResource",
    )


# Values -----------------------------------------------------------------------------------------------------
def new_id() -> str:
    """A resource or operation id: Compute sends its uint64 ids as decimal strings."""
    return str(secrets.randbits(63) | 1 << 62)


def new_fingerprint() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 with milliseconds and an offset, as Compute writes creationTimestamp and operation times."""
    return (moment or datetime.now(UTC)).isoformat(timespec="milliseconds")


def check_name(value: object, field: str = "resource.name") -> str:
    if not value:
        raise required(field)
    if not isinstance(value, str) or not NAME.match(value):
        raise invalid_field(field, value, f"Must be a match of regex '{NAME_PATTERN}'")
    return value


def check_region(region: str) -> str:
    if not REGION.match(region):
        raise invalid_field("region", region, "Unknown region.")
    return region


def last_segment(value: str) -> str:
    return value.rstrip("/").rsplit("/", 1)[-1]


def network_ref(value: object) -> tuple[str | None, str]:
    """(project or None, name) of a network reference: full URL, ``projects/p/global/networks/n``,
    ``global/networks/n`` or a bare name."""
    if not isinstance(value, str) or not value:
        raise required("resource.network")
    match = NETWORK_REF.match(value)
    if match:
        return match["project"], match["name"]
    if NAME.match(value):
        return None, value
    raise invalid_field("resource.network", value, "The URL is malformed.")


def parse_range(value: object, field: str = "resource.ipCidrRange") -> ipaddress.IPv4Network:
    """An IPv4 CIDR range usable by a subnetwork; host bits must be zero, as Compute requires."""
    if not value:
        raise required(field)
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        raise invalid_field(field, value, f"Invalid IPCidrRange: {value} is not a valid CIDR range.") from None
    if not isinstance(network, ipaddress.IPv4Network) or "/" not in str(value):
        raise invalid_field(field, value, f"Invalid IPCidrRange: {value} is not a valid IPv4 CIDR range.")
    if network.prefixlen > MAX_PREFIX_LENGTH:
        raise invalid_field(
            field, value, f"Invalid IPCidrRange: {value}. The prefix length must be at most {MAX_PREFIX_LENGTH}."
        )
    if network.is_loopback or network.is_link_local or network.is_multicast or network.is_unspecified:
        raise invalid_field(field, value, f"Invalid IPCidrRange: {value} is in a reserved address space.")
    if network.is_reserved or network.overlaps(ipaddress.IPv4Network("0.0.0.0/8")):
        raise invalid_field(field, value, f"Invalid IPCidrRange: {value} is in a reserved address space.")
    return network


# List filters -----------------------------------------------------------------------------------------------
FILTER_TERM = re.compile(
    r"""\(?\s*(?P<field>[A-Za-z][\w.]*)\s*(?P<op>!=|=|\beq\b|\bne\b)\s*
        (?P<value>"[^"]*"|'[^']*'|[^\s()]+)\s*\)?""",
    re.VERBOSE,
)


def compile_filter(expression: str | None):
    """A predicate for Compute's list ``filter``: ``field = v``, ``field != v`` (``*`` wildcards), and the
    older ``field eq regex`` / ``field ne regex``; terms are ANDed. Anything else is a 400, not a silent
    match-all, so a caller never mistakes an unsupported filter for an empty or full result."""
    if not expression or not expression.strip():
        return lambda _item: True
    terms: list[tuple[str, str, str]] = []
    rest = expression.strip()
    while rest:
        match = FILTER_TERM.match(rest)
        if not match:
            raise invalid_field("filter", expression, "Invalid list filter expression.")
        value = match["value"]
        if value[:1] in "\"'" and value[-1:] == value[:1]:
            value = value[1:-1]
        terms.append((match["field"], match["op"], value))
        rest = rest[match.end() :].lstrip()
        if rest.upper().startswith("AND "):
            rest = rest[4:].lstrip()

    def lookup(item: dict, path: str) -> str:
        current: object = item
        for part in path.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if isinstance(current, bool):
            return str(current).lower()
        return "" if current is None else str(current)

    def matches(item: dict) -> bool:
        for path, op, value in terms:
            actual = lookup(item, path)
            if op in ("=", "!="):
                pattern = "^" + ".*".join(re.escape(part) for part in value.split("*")) + "$"
                hit = re.match(pattern, actual) is not None
            else:
                hit = re.fullmatch(value, actual) is not None
            if hit != (op in ("=", "eq")):
                return False
        return True

    return matches


def page(items: list[dict], query: dict[str, str]) -> tuple[list[dict], str | None]:
    """One page of ``items`` for ``maxResults`` / ``pageToken`` (an opaque offset)."""
    try:
        size = min(max(int(query.get("maxResults", "500")), 0), 500) or 500
    except ValueError:
        raise invalid_field("maxResults", query.get("maxResults"), "Must be an integer.") from None
    token = query.get("pageToken", "")
    try:
        start = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
    except ValueError:
        raise invalid_field("pageToken", token, "Invalid page token.") from None
    end = start + size
    following = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
    return items[start:end], following


def order(items: list[dict], order_by: str | None) -> list[dict]:
    if not order_by:
        return items
    key, _, direction = order_by.strip().partition(" ")
    if key not in ("name", "creationTimestamp") or direction.strip() not in ("", "asc", "desc"):
        raise invalid_field("orderBy", order_by, "Only 'name' and 'creationTimestamp desc' are supported.")
    return sorted(items, key=lambda item: item.get(key, ""), reverse=direction.strip() == "desc")
