"""What goes wrong with the Hugging Face Hub, as errors whose messages say what to change.

Every Hub module raises these: the retry policy (tasks/weights/hub_retry.py) turns a final failure into one, the
listing (hub_listing.py) refuses names and numbers it cannot trust, the download (hub_download.py) refuses bytes
that do not match.
"""

from __future__ import annotations


class HubError(RuntimeError):
    """A Hub failure that retrying cannot fix; the message says what to change."""


class HubAccessDenied(HubError):
    """The Hub (or its CDN) refused this token, or no token, for the repo or the file."""


class HubNotFound(HubError):
    """No such repo, revision or file at the endpoint (or a private repo the token may not see)."""


class HubRateLimitExhausted(HubError):
    """The Hub kept answering 429 until the retry policy ran out."""


class HubUnreachable(HubError):
    """No connection to the Hub could be opened: a wrong endpoint, or no route to it from where the flow runs."""


class HubUnavailable(HubError):
    """The Hub kept failing (5xx, 408, connections dropped mid-answer) until the retry policy ran out."""


class ChecksumMismatch(HubError):
    """A downloaded file's bytes do not match the digest or size the Hub listed for it."""


class HubListingError(HubError):
    """A name or number in the Hub's file listing that cannot be trusted (a broken or hostile mirror, or a Hub bug)."""


# What to do about a listing that cannot be trusted: said at the end of every HubListingError.
LISTING_FIX = (
    "if hub_endpoint names a mirror, fix the mirror or leave hub_endpoint empty for https://huggingface.co; "
    "otherwise pin revision to a commit without it and tell the repo's owner"
)


def gated_error(repo_id: str, endpoint: str) -> HubAccessDenied:
    """The refusal of a gated repo, with the two steps that lift it (the licence, and a token that may read it)."""
    return HubAccessDenied(
        f"{repo_id} is gated: accept its licence at {endpoint}/{repo_id} with your Hugging Face account, then give "
        "the pipeline a token of that account (a Prefect Secret block named in ModelSource.token_secret_block, "
        "or HF_TOKEN). Accepted already? A fine-grained token also needs its permission 'Read access to contents "
        "of all public gated repos you can access' checked (huggingface/huggingface_hub issue 2844)"
    )
