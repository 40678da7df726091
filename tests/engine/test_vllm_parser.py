"""Every argv the product renders goes through the real engine's own `vllm serve` CLI: none may be refused.

The matrix is every preset x load mode x runtime-token setting x the image strategies the product renders for it
(the Model Garden launcher's `vllm serve ...`, an image whose entrypoint is `vllm serve`, and the serve-wrapper
recipe's script, which is run for real to see the command it execs). Each argv is what the container's `vllm`
receives; vllm_cli_check.py runs it through vLLM's `main()` in the engine venv up to where serving would begin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from blocks import GcpTarget, ModelSource, ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from blocks.profile import PRESETS
from tasks.deploy.render import Weights, entrypoint_style, render_service
from tasks.image.images import RECIPES_DIR

TARGET = GcpTarget(project="acme-ml-prod", region="us-central1")
SOURCE = ModelSource(repo_id="google/gemma-4-E2B-it")
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = Weights(SOURCE.repo_id, SHA, TARGET.bucket_name, f"model-cache/{SOURCE.repo_id}/{SHA}", 10 * 10**9)
DIGEST = "sha256:" + "0" * 64
CHECK_SCRIPT = Path(__file__).with_name("vllm_cli_check.py")


def built(image_name: str) -> str:
    return f"{TARGET.region}-docker.pkg.dev/{TARGET.project}/{TARGET.artifact_repository}/{image_name}@{DIGEST}"


def strategies(preset: str) -> dict[str, dict]:
    """Profile overrides (image or build) for each way the product can serve this preset."""
    wrapper = {"image": None, "build": {"recipe": "serve-wrapper"}}
    if PRESETS[preset].get("gpu_type"):
        generic = {"image": "vllm/vllm-openai:v0.33.0"}
        return {"model-garden": {"image": MODEL_GARDEN_VLLM_IMAGE}, "vllm-openai": generic, "serve-wrapper": wrapper}
    return {"vllm-cpu-recipe": {}, "serve-wrapper": wrapper}


def image_for(profile: ServingProfile) -> str:
    return profile.image or built(profile.build.image_name)


def wrapper_command(args: list[str], env: dict[str, str], port: int, tmp_path: Path) -> list[str]:
    """Run the serve-wrapper recipe's script with a `vllm` on PATH that records the argv it is exec'd with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "argv.json"
    fake = bin_dir / "vllm"
    recorder = f'import json,sys; json.dump(sys.argv[1:], open("{record}","w"))'
    fake.write_text(f"#!/bin/sh\nexec python3 -c '{recorder}' \"$@\"\n")
    fake.chmod(0o755)
    script = RECIPES_DIR / "serve_wrapper" / "serve-model.sh"
    run_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **env, "PORT": str(port)}
    subprocess.run(["/bin/sh", str(script), *args], env=run_env, check=True)
    return json.loads(record.read_text())


def serve_words(preset: str, strategy: str, load_mode: str, token: bool, tmp_path: Path) -> list[str]:
    """The words after `vllm serve` in the container the product renders for this case."""
    overrides = strategies(preset)[strategy]
    profile = ServingProfile.preset(preset, load_mode=load_mode, hf_token_at_runtime=token, **overrides)
    image = image_for(profile)
    container = render_service(profile, TARGET, SOURCE, WEIGHTS, image, revision="svc-rev").template.containers[0]
    args = list(container.args)
    style = entrypoint_style(image, profile)
    if style == "exec-args":
        assert args[:2] == ["vllm", "serve"], args
        return args[2:]
    if style == "env-wrapper":
        env = {e.name: e.value for e in container.env if e.value}
        command = wrapper_command(args, env, container.ports[0].container_port, tmp_path)
        assert command[0] == "serve", command
        return command[1:]
    return args


CASES = [
    (preset, strategy, load_mode, token)
    for preset in PRESETS
    for strategy in strategies(preset)
    for load_mode in ("gcs-volume", "runai-streamer")
    for token in (False, True)
]


def test_every_rendered_argv_is_accepted_by_the_real_vllm_serve_cli(engine_venv: Path, tmp_path: Path):
    argvs = {}
    for i, case in enumerate(CASES):
        case_dir = tmp_path / f"case-{i}"
        case_dir.mkdir()
        argvs[case] = serve_words(*case, case_dir)
    cases_file, results_file = tmp_path / "argvs.json", tmp_path / "results.json"
    cases_file.write_text(json.dumps(list(argvs.values())))
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    subprocess.run(
        [str(engine_venv / "bin" / "python"), str(CHECK_SCRIPT), str(cases_file), str(results_file)],
        env=env, check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    results = json.loads(results_file.read_text())
    assert len(results) == len(CASES) >= 20
    refused = [
        f"{'/'.join(map(str, case))}: {' '.join(argv)}\n    {result.get('error') or result.get('stderr', '')[-400:]}"
        for (case, argv), result in zip(argvs.items(), results, strict=True)
        if not result["ok"]
    ]
    assert not refused, f"{len(refused)} of {len(CASES)} rendered argvs refused by vllm serve:\n" + "\n".join(refused)


@pytest.mark.parametrize("bad", [["--no-such-flag"], ["--max-num-seqs", "many"]])
def test_the_check_can_see_a_refusal(engine_venv: Path, tmp_path: Path, bad: list[str]):
    """The same check refuses what vLLM refuses, with vLLM's own words (so a pass above means something)."""
    cases_file, results_file = tmp_path / "argvs.json", tmp_path / "results.json"
    cases_file.write_text(json.dumps([["/mnt/models/x", *bad]]))
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    subprocess.run(
        [str(engine_venv / "bin" / "python"), str(CHECK_SCRIPT), str(cases_file), str(results_file)],
        env=env, check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    (result,) = json.loads(results_file.read_text())
    assert result["ok"] is False and result["code"] == 2
    # Unknown flags are refused by the top-level `vllm` parser, bad values by `vllm serve`'s.
    assert re.search(r"^vllm( serve)?: error: ", result["stderr"], re.MULTILINE), result["stderr"]
