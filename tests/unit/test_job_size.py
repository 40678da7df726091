"""How bootstrap sizes the Cloud Run pool's jobs for the models the project stages (tasks/report/work_pool.py)."""

from __future__ import annotations

import pytest

from tasks.report.work_pool import PROMOTION_BUDGET_S, STAGING_CPU_S_PER_GIB, job_size


def test_a_62_gb_model_at_the_assumed_network_rate_fits_two_vcpus_with_its_staging_in_the_timeout():
    size = job_size(62_000_000_000)
    # 2 vCPU stage at 2 / 4.4 CPU-s per GiB = 488 MB/s on CPU alone: the 100 MB/s network binds first.
    assert (size.cpu, size.memory, size.staging_mb_s) == (2, "4Gi", 100.0)
    assert size.staging_s == pytest.approx(620)
    assert size.timeout_s == PROMOTION_BUDGET_S + 16 * 60  # 620 s x 1.5 = 930 s, rounded up to whole minutes


def test_a_faster_network_gets_the_vcpus_that_keep_up_with_it():
    assert job_size(62_000_000_000, network_mb_s=400).cpu == 2
    assert job_size(62_000_000_000, network_mb_s=600).cpu == 4
    eight = job_size(62_000_000_000, network_mb_s=5000)
    assert eight.cpu == 8 and eight.staging_mb_s == pytest.approx(8 / STAGING_CPU_S_PER_GIB * 1024**3 / 1e6)


def test_a_bigger_model_gets_a_longer_timeout_never_a_shorter_one():
    sizes = [job_size(n * 10**9).timeout_s for n in (1, 62, 400, 1000)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_a_rate_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="positive rate"):
        job_size(10**9, network_mb_s=0)
