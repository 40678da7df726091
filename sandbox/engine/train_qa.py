"""Train ``sandbox/tiny-llama-qa``'s weights: ``/work/main/.engine/bin/python -m sandbox.engine.train_qa [--check]``.

Run with the engine venv's python (torch, transformers); ``make test`` never imports this module. It builds
transformers' ``LlamaForCausalLM`` from the repo's own config.json (so the architecture is exactly what vLLM
loads), trains it in float32 on the quality set's chat prompts (loss on the answer and its ``<|eot_id|>`` only) and
on ``REFERENCE_TEXT`` as plain text, then casts to bf16 and checks, in bf16, that greedy decoding gives every answer
with a margin (the engine's CPU kernels round differently than torch's). It writes
sandbox/hub/tiny_llama_qa.safetensors with tiny_llama's tensor order; ``--check`` writes nothing and says whether
a retrain gives the same bytes as the file in git.

Deterministic: one seed, one thread (a float sum's order depends on the thread count), deterministic algorithms,
full-batch steps. Why the result is kept in git rather than trained by ``make engine``: sandbox/hub/tiny_llama_qa.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from sandbox.hub import tiny_llama as tl
from sandbox.hub import tiny_llama_qa as qa

SEED = 0
STEPS = 300
LR = 3e-3
MIN_MARGIN = 2.0  # logit gap between the trained token and the runner-up, in bf16, at every answer position


def examples() -> list[tuple[list[int], int]]:
    """(ids, index of the first scored position) per example: chat answers, then the reference text."""
    rows = [(qa.chat_ids(prompt) + qa.answer_ids(answer), len(qa.chat_ids(prompt))) for prompt, answer in qa.QA]
    return [*rows, (list(qa.REFERENCE_TEXT.encode()), 1)]


def check_tokens() -> None:
    """The ids trained on are the ones vLLM feeds the model: it renders the chat template, then tokenizes the text
    without adding special tokens (the template has the BOS); a completion prompt is tokenized as is."""
    with tempfile.TemporaryDirectory() as folder:
        for path, text in qa.config_files().items():
            Path(folder, path).write_text(text)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    for prompt, answer in qa.QA:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert tokenizer.encode(text, add_special_tokens=False) == qa.chat_ids(prompt), prompt
        assert tokenizer.encode(answer, add_special_tokens=False) == qa.answer_ids(answer)[:-1], answer
    assert tokenizer.encode(qa.REFERENCE_TEXT) == list(qa.REFERENCE_TEXT.encode())


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 where nothing is scored)."""
    rows = examples()
    width = max(len(ids) for ids, _ in rows)
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for row, (ids, first) in enumerate(rows):
        inputs[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        labels[row, first : len(ids)] = torch.tensor(ids[first:])
    return inputs, mask, labels


def new_model() -> LlamaForCausalLM:
    settings = json.loads(tl.config_json(qa.DIMS))
    settings.pop("torch_dtype")  # the file's dtype (bf16); training runs in float32
    return LlamaForCausalLM(LlamaConfig(**settings)).float()


def train() -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = new_model()
    inputs, mask, labels = batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, STEPS)
    model.train()
    for step in range(STEPS):
        loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step}: loss {loss.item():.5f}", flush=True)
    return model.eval()


@torch.no_grad()
def greedy(model: LlamaForCausalLM, ids: list[int], limit: int = 32) -> list[int]:
    """Greedy continuation until ``<|eot_id|>`` (included) or ``limit`` tokens."""
    out: list[int] = []
    eot = qa.answer_ids("")[0]
    while len(out) < limit:
        logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
        out.append(int(logits.argmax()))
        if out[-1] == eot:
            break
    return out


@torch.no_grad()
def margins(model: LlamaForCausalLM) -> float:
    """The smallest gap between the trained token's logit and the best other one, over every answer position."""
    smallest = float("inf")
    for prompt, answer in qa.QA:
        ids, target = qa.chat_ids(prompt), qa.answer_ids(answer)
        logits = model(input_ids=torch.tensor([ids + target])).logits[0, len(ids) - 1 : -1].float()
        right = logits.gather(1, torch.tensor(target)[:, None])[:, 0]
        logits[torch.arange(len(target)), torch.tensor(target)] = float("-inf")
        smallest = min(smallest, float((right - logits.max(1).values).min()))
    return smallest


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, text: str) -> float:
    """exp of the mean negative log-likelihood of ``text``'s tokens after the first, as prompt_logprobs scores it."""
    ids = torch.tensor([list(text.encode())])
    return math.exp(float(model(input_ids=ids, labels=ids).loss))


def check_bf16(model: LlamaForCausalLM) -> list[str]:
    """What is wrong with the bf16 model's greedy answers, if anything."""
    model = model.to(torch.bfloat16)
    problems = []
    for prompt, answer in qa.QA:
        got = greedy(model, qa.chat_ids(prompt))
        if got != qa.answer_ids(answer):
            problems.append(f"{prompt!r}: got {bytes(i for i in got if i < 256)!r}, want {answer!r}")
    gap = margins(model)
    known, unseen = perplexity(model, qa.REFERENCE_TEXT), perplexity(model, qa.OUTSIDE_TEXT)
    print(f"bf16 smallest logit margin: {gap:.2f}; perplexity {known:.3f} (reference), {unseen:.1f} (outside)")
    if gap < MIN_MARGIN:
        problems.append(f"smallest logit margin {gap:.2f} < {MIN_MARGIN}")
    return problems


def safetensors_bytes(model: LlamaForCausalLM) -> bytes:
    """The weights in bf16, laid out as tiny_llama lays out its tensors (same names, order and header)."""
    state = model.state_dict()
    parts = [qa.safetensors_layout()]
    for name, shape in tl.tensor_shapes(qa.DIMS):
        tensor = state[name].to(torch.bfloat16).contiguous()
        assert tuple(tensor.shape) == shape, (name, tuple(tensor.shape), shape)
        parts.append(tensor.view(torch.int16).numpy().tobytes())
    return b"".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="retrain and compare with the file in git; write nothing")
    args = parser.parse_args(argv)
    began = time.monotonic()
    check_tokens()
    model = train()
    data = safetensors_bytes(model)
    problems = check_bf16(model)
    digest = hashlib.sha256(data).hexdigest()
    print(f"trained in {time.monotonic() - began:.1f} s: {len(data)} bytes, sha256 {digest}")
    if problems:
        print("the bf16 weights do not answer the quality set:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.check:
        kept = hashlib.sha256(qa.WEIGHTS.read_bytes()).hexdigest() if qa.WEIGHTS.exists() else "(missing)"
        print(f"{qa.WEIGHTS.name} in git: sha256 {kept}: {'the same' if kept == digest else 'DIFFERENT'}")
        return 0 if kept == digest else 1
    qa.WEIGHTS.write_bytes(data)
    print(f"wrote {qa.WEIGHTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
