"""Scoring a quality set's answers: pure functions, no I/O."""

from __future__ import annotations

import re

from tasks.quality.spec import Expect


def passes(expect: Expect, answer: str) -> bool:
    """Whether ``answer`` (stripped of surrounding whitespace) is what ``expect`` asks for."""
    text = answer.strip()
    if expect.exact is not None:
        return text == expect.exact
    if expect.one_of is not None:
        return text in expect.one_of
    if expect.contains is not None:
        return expect.contains in text
    return expect.regex is not None and re.search(expect.regex, text) is not None


def score(passed: list[bool]) -> float:
    """The fraction of prompts passed (0 for no prompt)."""
    return sum(passed) / len(passed) if passed else 0.0


def agreement(first: list[str], second: list[str]) -> float:
    """The fraction of prompts whose two answers are identical once stripped (greedy decoding on the same weights
    should give the same text)."""
    if len(first) != len(second):
        raise ValueError(f"agreement of {len(first)} answers with {len(second)}: the two lists must pair up")
    same = [a.strip() == b.strip() for a, b in zip(first, second, strict=True)]
    return score(same)


# A float threshold met exactly (0.9 against 1.0 - 0.1) must count as met.
EPSILON = 1e-9


def at_least(value: float, threshold: float) -> bool:
    """``value >= threshold``, allowing for float rounding."""
    return value + EPSILON >= threshold
