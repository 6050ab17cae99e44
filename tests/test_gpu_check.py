"""`make gpu-check` on a machine without CUDA (CI): it runs its CPU parts, says so, exits 0;
and the grids it projects are the experiments' real sweeps."""

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
