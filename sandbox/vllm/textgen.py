"""Deterministic "generation": token counts and text derived from the prompt and the model name.

Same prompt, same model, same answer: tests can compare responses across revisions, and a response from
the wrong model (a stale revision, a wrong served name) reads differently.

What a model "knows": the stand-in's weights are synthetic bytes, so a sandbox repo writes its knowledge in its
config.json, under the sandbox-only key ``sandbox_answers`` ({prompt: answer}; only repos the stand-in serves carry
it: sandbox/tiny-llama, which the real engine serves, does not). config.json is among the
files the product stages by default (tasks/weights/selection.py), so a revision knows what the commit it serves knows.
A chat request whose last user message is one of those prompts gets that answer, recited token by token; every other
prompt gets the deterministic words. The fault ``wrong_answers`` (sandbox/vllm/instance.Faults) forgets it all: the
instance answers 200s, fluently, in the deterministic words, never the known answer (the words come from
``_VOCABULARY``, which holds none of the sandbox's known answers).

A model also knows texts by heart: config.json's sandbox-only key ``sandbox_reference`` (a list of texts), what a
quality gate measures perplexity on with ``prompt_logprobs`` (sandbox/vllm/scoring.py: a known text scores near 1,
any other text in the hundreds). ``wrong_answers`` forgets those too.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")
_PIECE = re.compile(r"\s*(?:[A-Za-z0-9]+|[^\sA-Za-z0-9])")
_VOCABULARY = (
    "the model answers from sandbox with a short reply about weights tokens graphs cache serving latency "
    "probes revisions traffic buckets volumes streams engines batches prompts and every request gets its own "
    "deterministic words so tests can compare them"
)
_WORDS = _VOCABULARY.split()
# The stand-in's vocabulary, each word once: what it can name as a likelier token than a prompt's (scoring.py).
DISTINCT_WORDS = tuple(dict.fromkeys(_WORDS))
# Chat templates wrap each message in role markers; vLLM counts those tokens too.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_FOR_REPLY = 3
# A vision encoder turns each image into a fixed block of tokens.
TOKENS_PER_IMAGE = 256
MIN_NATURAL_TOKENS = 6
NATURAL_TOKEN_SPREAD = 26


def count_tokens(text: str) -> int:
    """A stable stand-in for a tokenizer: words and punctuation (one token per CJK character)."""
    return len(_TOKEN.findall(text))


def pieces(text: str) -> list[str]:
    """``text``'s tokens as count_tokens counts them, each with the whitespace before it (what a tokenizer decodes
    a token to); trailing whitespace belongs to no token."""
    return _PIECE.findall(text)


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's messages flattened the way a template would, with their multimodal items."""

    text: str
    tokens: int
    mm_items: dict[str, int]


def render_chat(messages: list[dict[str, Any]]) -> ChatPrompt:
    """Flatten messages (string or list-of-parts content); raises ValueError on a malformed message."""
    lines: list[str] = []
    items: dict[str, int] = {}
    extra = CHAT_TOKENS_FOR_REPLY
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError("each message needs a role")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type", "text") if isinstance(part, dict) else "text"
                if kind == "text":
                    texts.append(str(part.get("text", "")) if isinstance(part, dict) else str(part))
                else:
                    modality = kind.split("_")[0]  # image_url -> image, input_audio -> input
                    modality = "audio" if kind in ("input_audio", "audio_url") else modality
                    items[modality] = items.get(modality, 0) + 1
                    extra += TOKENS_PER_IMAGE
            content = " ".join(texts)
        lines.append(f"{message['role']}: {content or ''}")
        extra += CHAT_TOKENS_PER_MESSAGE
    text = "\n".join(lines)
    return ChatPrompt(text=text, tokens=count_tokens(text) + extra, mm_items=items)


@dataclass(frozen=True)
class Generated:
    """One choice: its tokens (text pieces that concatenate to the answer) and why it stopped."""

    pieces: tuple[str, ...]
    finish_reason: str

    @property
    def text(self) -> str:
        """The whole answer."""
        return "".join(self.pieces)


ANSWERS_KEY = "sandbox_answers"


def known_answers(config: dict[str, Any]) -> dict[str, str]:
    """The answers a model's config.json says it knows ({prompt: answer}; anything else under the key is ignored)."""
    found = config.get(ANSWERS_KEY)
    if not isinstance(found, dict):
        return {}
    return {str(prompt).strip(): answer for prompt, answer in found.items() if isinstance(answer, str)}


REFERENCE_KEY = "sandbox_reference"


def known_references(config: dict[str, Any]) -> frozenset[str]:
    """The texts a model's config.json says it knows by heart (stripped; anything but a list of strings is ignored)."""
    found = config.get(REFERENCE_KEY)
    if not isinstance(found, list):
        return frozenset()
    return frozenset(text.strip() for text in found if isinstance(text, str) and text.strip())


def answer_to(answers: dict[str, str], messages: list[Any]) -> str | None:
    """The answer known to the conversation's last user message (its text, stripped), if any."""
    asked = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), None)
    return answers.get(asked.strip()) if isinstance(asked, str) else None


def recite(answer: str, max_tokens: int, extend_to: int = 0) -> Generated:
    """A known ``answer``, token by token, cut at ``max_tokens`` (finish_reason "length"); ``extend_to`` tokens at
    least (vLLM's ``min_tokens``, ``ignore_eos``): the deterministic words go on after it."""
    tokens = pieces(answer)
    if extend_to > len(tokens):
        more = generate(answer, answer, 0, extend_to - len(tokens), ignore_eos=True).pieces
        tokens += [f" {piece.strip()}" for piece in more]
    natural = len(tokens)
    return Generated(tuple(tokens[:max_tokens]), "stop" if natural <= max_tokens else "length")


def generate(
    model_name: str, prompt: str, index: int, max_tokens: int, ignore_eos: bool = False, min_tokens: int = 0
) -> Generated:
    """The answer ``model_name`` gives to ``prompt`` (choice ``index``), at most ``max_tokens`` long.

    ``ignore_eos`` (vLLM's sampling parameter): the answer never ends by itself, only at ``max_tokens``.
    ``min_tokens`` (as vLLM's sampling parameter: no end of sequence before it): an answer that would end sooner
    goes on with more words to at least that many tokens; its first words stay those it had without.
    """
    digest = hashlib.sha256(f"{model_name}\0{prompt}\0{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    natural = MIN_NATURAL_TOKENS + rng.randrange(NATURAL_TOKEN_SPREAD)
    if ignore_eos:
        natural = max_tokens + 1
    # The words are drawn after the length, one per token, so a longer answer extends the same sequence.
    natural = max(natural, min_tokens)
    length = min(natural, max_tokens)
    words = [rng.choice(_WORDS) for _ in range(length)]
    pieces = [(" " if i else "") + (w.capitalize() if i == 0 else w) for i, w in enumerate(words)]
    if length == natural and pieces:
        pieces[-1] += "."
    return Generated(tuple(pieces), "stop" if natural <= max_tokens else "length")
