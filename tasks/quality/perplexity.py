"""The perplexity of a reference text, measured with vLLM's ``prompt_logprobs`` on the completions API.

A model that answers its prompts can still have lost what it knew elsewhere (a broken quantization, a dtype change):
the perplexity of a text it has seen says so in one request. vLLM scores the prompt's own tokens when a completion
asks for ``prompt_logprobs`` (vllm/sampling_params.py: an int >= 0, or -1 for the whole vocabulary; not with
``stream``); ``prompt_logprobs: 0`` returns, for each prompt token after the first, a dict holding the logprob of
that very token (the first token has no context: its entry is null). ``return_token_ids`` returns the prompt's token
ids beside them, so the prompt token is found by its id even where a dict holds more entries.

perplexity = exp(-mean(logprob of each prompt token after the first)): 1 for a text the model knows by heart.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from pydantic import BaseModel, Field


class Measured(BaseModel):
    """One revision's perplexity of the reference text, or why there is none."""

    value: float | None = None
    tokens: int = Field(0, description="The prompt tokens scored (all but the first).")
    error: str | None = None


def request_body(served_name: str, text: str) -> dict[str, Any]:
    """The completion that scores ``text``: one token generated, every prompt token's logprob returned."""
    return {"model": served_name, "prompt": text, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0,
            "return_token_ids": True}  # fmt: skip


def token_logprob(entry: dict[str, Any], token_id: int | None) -> float:
    """The prompt token's logprob from one position's dict: by its id, else the dict's only entry."""
    if token_id is not None and str(token_id) in entry:
        return float(entry[str(token_id)]["logprob"])
    if len(entry) == 1:
        return float(next(iter(entry.values()))["logprob"])
    raise ValueError("a position's logprobs do not say which is the prompt's own token")


def from_response(data: dict[str, Any]) -> Measured:
    """The perplexity a completion's ``prompt_logprobs`` give; ValueError, KeyError or TypeError when the response
    is not vLLM's shape."""
    choice = data["choices"][0]
    positions = choice["prompt_logprobs"]
    if not isinstance(positions, list):
        raise ValueError("no prompt_logprobs in the response")
    ids = choice.get("prompt_token_ids") or [None] * len(positions)
    logprobs = [token_logprob(entry, token_id) for entry, token_id in zip(positions, ids, strict=False) if entry]
    if not logprobs:
        raise ValueError("the text is one token: nothing to score")
    return Measured(value=math.exp(-sum(logprobs) / len(logprobs)), tokens=len(logprobs))


def measure(client: httpx.Client, served_name: str, text: str) -> Measured:
    """``text``'s perplexity on the revision ``client`` is opened on; an error is recorded, never raised."""
    try:
        response = client.post("/v1/completions", json=request_body(served_name, text))
    except httpx.HTTPError as exc:
        return Measured(error=f"no answer ({type(exc).__name__})")
    if response.status_code != 200:
        return Measured(error=f"HTTP {response.status_code}")
    try:
        return from_response(response.json())
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Measured(error=f"not vLLM's prompt_logprobs ({exc})")
