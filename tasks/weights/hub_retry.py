"""The retry policy of every Hugging Face Hub call, and which failures are worth retrying.

Every Hub call goes through this one policy (lesson 11): 429 waits as long as the Hub asks (Retry-After in
seconds or as an HTTP date, or the reset of the ``RateLimit`` header), with jitter, a cap per wait and a
budget in total, and each wait is logged; 5xx, 408 and dropped connections back off exponentially; other
4xx fail at once with a message that says what to do. huggingface_hub itself never retries
``model_info``, which is why resolution needs this (FACTS.md).
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import httpx
import httpx2
import tenacity
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_ratelimit_headers
from pydantic import BaseModel, Field

from tasks.common.clients import HubAccess
from tasks.common.logs import run_logger
from tasks.weights.hub_errors import (
    HubAccessDenied,
    HubError,
    HubNotFound,
    HubRateLimitExhausted,
    HubUnavailable,
    HubUnreachable,
    gated_error,
)

T = TypeVar("T")


class HubRetryPolicy(BaseModel):
    """How long to keep trying the Hub. Waits on 429 follow the Hub's own hint, capped and budgeted."""

    max_attempts: int = Field(8, ge=1, le=100, description="Attempts per call, the first included.")
    max_wait_s: float = Field(300, gt=0, description="Longest single wait, even if the Hub asks for more.")
    budget_s: float = Field(1800, gt=0, description="Total waiting allowed for one call before giving up.")
    jitter: float = Field(0.1, ge=0, le=1, description="Random extra wait, as a share of each wait.")
    backoff_initial_s: float = Field(1, gt=0, description="First wait after a 5xx or a dropped connection.")
    backoff_max_s: float = Field(30, gt=0, description="Longest wait after a 5xx or a dropped connection.")


class RetryStats:
    """Waits taken by the retry policy during one stage, for the promotion report (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rate_limited = 0
        self.other = 0
        self.waited_s = 0.0

    def record(self, rate_limited: bool, seconds: float) -> None:
        """Count one wait of ``seconds``, a rate limit (429) or another transient failure."""
        with self._lock:
            if rate_limited:
                self.rate_limited += 1
            else:
                self.other += 1
            self.waited_s += seconds


class TransientHubResponse(Exception):
    """A Hub answer worth retrying (429, 408, 5xx), with the headers that say how long to wait."""

    def __init__(self, status: int, headers: httpx.Headers | dict, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}")
        self.status = status
        self.headers = headers


class IncompleteBody(Exception):
    """The connection ended before the announced number of bytes arrived."""


def _status_and_headers(exc: BaseException) -> tuple[int, dict] | None:
    if isinstance(exc, TransientHubResponse):
        return exc.status, dict(exc.headers)
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code, dict(exc.response.headers)
    return None


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: 429, 408, 5xx, and connections that failed or dropped mid-body."""
    if isinstance(exc, (httpx.TransportError, httpx2.TransportError, IncompleteBody)):
        return True
    found = _status_and_headers(exc)
    return found is not None and (found[0] in (408, 429) or found[0] >= 500)


def retry_after_seconds(headers: dict, now: float | None = None) -> float | None:
    """Seconds the Hub asks us to wait: Retry-After (seconds or HTTP date), else the RateLimit reset."""
    lowered = {k.lower(): v for k, v in headers.items()}
    value = (lowered.get("retry-after") or "").strip()
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                moment = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                moment = None
            if moment is not None:
                return max(moment.timestamp() - (time.time() if now is None else now), 0.0)
    info = parse_ratelimit_headers(headers)
    return float(info.reset_in_seconds) if info is not None else None


class _HubWait(tenacity.wait.wait_base):
    def __init__(self, policy: HubRetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        found = _status_and_headers(exc) if exc else None
        hint = retry_after_seconds(found[1]) if found and found[0] == 429 else None
        if hint is None:
            hint = self.policy.backoff_initial_s * 2 ** (retry_state.attempt_number - 1)
            hint = min(hint, self.policy.backoff_max_s)
        wait = min(hint, self.policy.max_wait_s)
        return wait + wait * self.policy.jitter * random.random()


class _BudgetSpent(tenacity.stop.stop_base):
    def __init__(self, policy: HubRetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return retry_state.idle_for + (retry_state.upcoming_sleep or 0) > self.policy.budget_s


def _describe(exc: BaseException) -> str:
    found = _status_and_headers(exc)
    if found is None:
        return f"connection to the Hub failed ({type(exc).__name__})"
    if found[0] == 429:
        return "rate limited by the Hub"
    return f"the Hub answered HTTP {found[0]}"


def hub_retrying(
    policy: HubRetryPolicy,
    what: str,
    log: logging.Logger | logging.LoggerAdapter,
    stats: RetryStats | None = None,
) -> tenacity.Retrying:
    """A tenacity policy for one Hub call (``what`` names it in the log; ``stats`` counts the waits)."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if stats is not None:
            found = _status_and_headers(exc) if exc else None
            stats.record(bool(found and found[0] == 429), state.upcoming_sleep or 0.0)
        log.warning(
            "%s, waiting %.0f s, attempt %d of %d (%s)",
            _describe(exc) if exc else "Hub call failed",
            state.upcoming_sleep,
            state.attempt_number + 1,
            policy.max_attempts,
            what,
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=_HubWait(policy),
        stop=tenacity.stop_after_attempt(policy.max_attempts) | _BudgetSpent(policy),
        before_sleep=before_sleep,
        reraise=True,
    )


def call_hub(
    fn: Callable[[], T],
    what: str,
    policy: HubRetryPolicy,
    repo_id: str,
    access: HubAccess,
    stats: RetryStats | None = None,
) -> T:
    """Run one Hub call under the retry policy, translating final failures into messages that say what to do."""
    try:
        return hub_retrying(policy, what, run_logger(), stats)(fn)
    except Exception as exc:
        raise translate_hub_error(exc, what, repo_id, access, policy) from None


def _never_connected(exc: BaseException) -> bool:
    """The connection itself failed (refused, no route, DNS, TLS, connect timeout): nothing reached the Hub."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx2.ConnectError, httpx2.ConnectTimeout))


def exhausted_error(exc: BaseException, what: str, repo_id: str, access: HubAccess, policy: HubRetryPolicy) -> HubError:
    """The error for a transient failure that lasted until the retry policy ran out, named by its real cause:
    only a 429 is a rate limit; a Hub that could not be reached at all is named unreachable, with the endpoint
    and where that endpoint came from."""
    gave_up = (
        f"gave up after the retry policy ran out (max_attempts={policy.max_attempts}, budget_s={policy.budget_s:g})"
    )
    where = f"{access.endpoint} (from {access.endpoint_origin})"
    found = _status_and_headers(exc)
    if found is not None and found[0] == 429:
        return HubRateLimitExhausted(
            f"{what}: the Hub at {where} kept rate limiting {repo_id} (HTTP 429); {gave_up}. Anonymous calls from "
            "cloud IPs are rate limited: set a token, or raise HubRetryPolicy.budget_s / max_attempts"
        )
    detail = str(exc).splitlines()[0] if str(exc) else ""
    cause = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    if _never_connected(exc):
        return HubUnreachable(
            f"{what}: the Hub is unreachable: no connection to {where} could be opened ({cause}); {gave_up}. Check "
            "that this is the Hub you mean and that the machine running the flow can reach it (network, proxy, DNS, "
            "firewall), or set the model source's hub_endpoint (or HF_ENDPOINT) to one it can reach"
        )
    failing = f"kept answering HTTP {found[0]}" if found is not None else f"kept dropping the connection ({cause})"
    return HubUnavailable(
        f"{what}: the Hub at {where} {failing} for {repo_id}; {gave_up}. The Hub is failing, not refusing you: run "
        "again later, or raise HubRetryPolicy.budget_s / max_attempts"
    )


def translate_hub_error(
    exc: BaseException, what: str, repo_id: str, access: HubAccess, policy: HubRetryPolicy
) -> BaseException:
    """The HubError a final failure of ``what`` stands for, its message saying what to do (or ``exc`` as it is,
    when it is one already)."""
    if isinstance(exc, HubError):
        return exc
    endpoint = access.endpoint
    token_hint = (
        "set a token that can read it (ModelSource.token_secret_block names a Prefect Secret block, or HF_TOKEN)"
    )
    if isinstance(exc, GatedRepoError):
        return gated_error(repo_id, endpoint)
    if isinstance(exc, RevisionNotFoundError):
        return HubNotFound(
            f"{what}: revision not found in {repo_id}; use a branch, tag or full 40-character commit sha that "
            f"exists at {endpoint}/{repo_id}"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubNotFound(f"{what}: file not found in {repo_id} at that commit; check allow_patterns")
    if isinstance(exc, RepositoryNotFoundError):
        return HubNotFound(
            f"{what}: repo {repo_id} not found at {endpoint}, or it is private and the request was not allowed "
            f"to see it: check the repo id, and {token_hint}"
        )
    found = _status_and_headers(exc)
    if found is not None and found[0] in (401, 403):
        return HubAccessDenied(
            f"{what}: the Hub refused access to {repo_id} (HTTP {found[0]}): {token_hint}; for gated models accept "
            f"the licence at {endpoint}/{repo_id} with the same account"
        )
    if is_transient(exc):
        return exhausted_error(exc, what, repo_id, access, policy)
    return HubError(f"{what}: {repo_id}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
