"""What a revision holds of the region's quotas, as preflight reads it (tasks/checks/in_use.py)."""

from __future__ import annotations

from google.cloud import run_v2

from tasks.checks.in_use import minimums, size_of

MANUAL = run_v2.ServiceScaling.ScalingMode.MANUAL


def container(**limits: str) -> run_v2.Container:
    return run_v2.Container(resources=run_v2.ResourceRequirements(limits=limits))


def test_an_instances_size_is_its_containers_summed_with_cloud_runs_defaults():
    vllm = container(cpu="6", memory="24Gi", **{"nvidia.com/gpu": "1"})
    collector = container(cpu="2000m", memory="8192Mi")
    assert size_of([vllm, collector], "nvidia-l4") == (8.0, 32.0, 1)
    assert size_of([container()], "") == (1.0, 0.5, 0)  # no limits: 1 vCPU, 512 MiB


def service(traffic: list[tuple[str, int, str]], scaling: run_v2.ServiceScaling) -> run_v2.Service:
    statuses = [run_v2.TrafficTargetStatus(revision=r, percent=p, tag=t) for r, p, t in traffic]
    return run_v2.Service(traffic_statuses=statuses, scaling=scaling)


def test_minimums_follow_the_split_and_the_revisions_own():
    split = service([("a", 75, ""), ("b", 25, ""), ("c", 0, "candidate")], run_v2.ServiceScaling(min_instance_count=2))
    revisions = {name: run_v2.Revision() for name in "abc"}
    revisions["c"].scaling = run_v2.RevisionScaling(min_instance_count=1)  # tagged: its own minimum starts it
    assert minimums(split, revisions) == {"a": 2, "b": 1, "c": 1}


def test_a_manual_count_goes_to_the_revisions_taking_traffic_only():
    manual = service([("a", 100, ""), ("c", 0, "candidate")], run_v2.ServiceScaling(scaling_mode=MANUAL))
    assert minimums(manual, {"a": run_v2.Revision(), "c": run_v2.Revision()}) == {"a": 0}
