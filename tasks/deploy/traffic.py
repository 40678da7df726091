"""Traffic splits as Cloud Run takes them: whole percentages, one per revision, adding up to exactly 100."""

from __future__ import annotations


def rescaled(traffic: list[tuple[str, int]], total: int = 100) -> list[tuple[str, int]]:
    """``traffic`` scaled to add up to ``total`` in its own proportions (the largest remainders get the rounding, so
    the sum is exact as Cloud Run requires); a revision whose share rounds to 0 drops out."""
    whole = sum(p for _, p in traffic) or 1
    exact = [(revision, p * total / whole) for revision, p in traffic]
    shares = {revision: int(share) for revision, share in exact}
    left = total - sum(shares.values())
    for revision, _ in sorted(exact, key=lambda item: item[1] - int(item[1]), reverse=True)[:left]:
        shares[revision] += 1
    return [(revision, shares[revision]) for revision, _ in traffic if shares[revision]]


def canary_split(previous: list[tuple[str, int]], candidate: str, percent: int) -> list[tuple[str, int]]:
    """The candidate at ``percent``, the revisions that served before sharing the rest in their old proportions."""
    return [(candidate, percent), *rescaled(previous, 100 - percent)]


def describe_split(split: list[tuple[str, int]]) -> str:
    return " / ".join(f"{revision} {percent} %" for revision, percent in split)
