"""`make gpu-check` on a machine without CUDA (CI): it runs its CPU parts, says so, exits 0;
its comparison looks at the science only, its projection at the whole job, and the grids it
projects are the experiments' real sweeps."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from services import REPO, clean_env

from benchmarks import gpu_check


def test_grids_are_the_experiments_sweeps():
    assert len(gpu_check.grid("fig5")) == 2 * 2 * 6 * 9
    assert len(gpu_check.grid("fig6")) == len(gpu_check.grid("fig6_train")) == 2 * 5 * 5
    assert {j["depth"] for j in gpu_check.grid("fig6_train")} == {"12", "24", "48", "96", "192"}
    a, b = gpu_check.linear_in_depth({12: 1.2 + 0.5, 48: 4.8 + 0.5})
    assert a == pytest.approx(0.5) and b == pytest.approx(0.1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_cpu_only_machine_runs_the_cpu_parts_and_exits_0():
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--small"], cwd=REPO,
                       env=clean_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "CUDA device: none" in p.stdout and "no CUDA device" in p.stdout
    assert p.stdout.count("CPU float64") == 2  # Pre- and Post-Norm references
    assert "eager fp32" in p.stdout and "Traceback" not in p.stderr


def _result(scalars, series=None):
    return {"scalars": scalars, "series": {k: {"steps": list(range(len(v))), "values": v}
                                           for k, v in (series or {}).items()}}


def test_the_comparison_is_the_science_not_the_jobs_own_facts():
    """A CUDA job's seconds, peak memory and seed chunk differ from the CPU's by design: they
    never count as a mismatch (v1 compared them and would always have exited 1)."""
    ref = _result({"erank_io": 0.5, "peak_memory_gb": 1.2, "seed_chunk": 4.0, "measure_seconds": 9.0,
                   "build_seconds": 2.0}, {"erank_profile": [1.0, 0.8]})
    got = _result({"erank_io": 0.5 * (1 + 1e-13), "peak_memory_gb": 30.0, "seed_chunk": 1.0,
                   "measure_seconds": 0.1, "build_seconds": 0.01}, {"erank_profile": [1.0, 0.8]})
    diffs = gpu_check.science_differences(got, ref)
    assert {k for _, k in diffs} == {"erank_io", "erank_profile"}
    assert diffs[0][0] == pytest.approx(1e-13, rel=1e-3)
    got["series"]["erank_profile"]["values"] = [1.0, 0.8 + 1e-6]
    worst = gpu_check.science_differences(got, ref)[0]
    assert worst[1] == "erank_profile" and worst[0] == pytest.approx(1e-6, rel=1e-6)
    assert gpu_check.job_compute_s(ref) == 11.0  # weights + measurement


def test_the_projection_is_the_whole_job():
    """Start once, then per job its overhead plus its weights and measurement, linear in L per
    m/d (fitted from two depths)."""
    jobs = [{"depth": "48", "expansion": "1"}, {"depth": "96", "expansion": "1"},
            {"depth": "96", "expansion": "4"}]
    fits = {"1": gpu_check.linear_in_depth({48: 0.2 + 48 * 0.01, 384: 0.2 + 384 * 0.01}),
            "4": (0.5, 0.04)}
    total = gpu_check.project_grid(jobs, fits, per_job_s=0.1, start_s=7.0)
    assert total == pytest.approx(7.0 + 3 * 0.1 + (0.2 + 0.48) + (0.2 + 0.96) + (0.5 + 3.84))
    assert gpu_check.project_grid([], fits, per_job_s=0.1, start_s=7.0) == 7.0
