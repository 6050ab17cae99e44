"""Training faults through the real CLI on real CIFAR-10 (issue 8: item 6, rows 11 and 12,
and the training loop's side of interruption).

* a real SIGTERM to a running ``task=train`` process: the loop finishes its step, writes its
  checkpoint and stops; the same command again resumes and ends bit-identical (losses,
  accuracies, final weights) to a run that was never interrupted;
* ``task.lrs=[10.0,0.001]``: lr 10 is reported diverged (its loss stays finite);
* a truncated checkpoint is named, moved aside, and the run finishes.

The subprocess installs :func:`rankexp.interrupt.handler` for SIGTERM itself, as the job
wrapper does, so this tests the loop's cooperation independently of the wrapper.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from services import clean_env

from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT

pytestmark = pytest.mark.skipif(
    not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}"
)

# the command line as users start it (its job wrapper turns SIGTERM into a stop request)
DRIVER = "import sys; from rankexp.__main__ import cli; sys.argv[0] = 'rankexp'; cli()"


def tiny_train(run_dir: Path, ckpt_dir: Path, *extra: str) -> list[str]:
    return [
        "task=train", "width=16", "depth=2", "task.lrs=[0.001,0.01]", "task.steps=300",
        "task.eval_every=150", "task.log_every=10", "task.checkpoint_every=100000",
        "tracking.enabled=false", f"task.checkpoint_dir={ckpt_dir}",
        f"data.cache_dir={DEFAULT_CACHE_DIR}", f"hydra.run.dir={run_dir}", *extra,
    ]


def start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-c", DRIVER, *args], cwd=cwd, env=clean_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def finished(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return log.read_text()


def arrays(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "result" / "arrays.npz") as z:
        return {k: z[k] for k in z.files}


def final_model(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    (ckpt,) = ckpt_dir.glob("*.pt")
    payload = torch.load(ckpt, weights_only=True)
    assert payload["step"] == 300
    return payload["model"]


def test_sigterm_checkpoints_the_step_and_the_rerun_resumes_bit_identically(tmp_path):
    ref_dir, ref_ckpt = tmp_path / "ref", tmp_path / "ckpt-ref"
    ref = start(tiny_train(ref_dir, ref_ckpt), tmp_path, tmp_path / "ref.log")

    run_dir, ckpt_dir, log = tmp_path / "run", tmp_path / "ckpt", tmp_path / "run.log"
    proc = start(tiny_train(run_dir, ckpt_dir), tmp_path, log)
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if "step 30/300" in log.read_text():  # well inside the loop
            os.kill(proc.pid, signal.SIGTERM)
            break
        time.sleep(0.05)
    out = finished(proc, log)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "SIGTERM: stopped after step" in out and "interrupted by SIGTERM" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "KILLED"
    (ckpt,) = ckpt_dir.glob("*.pt")
    stopped_at = torch.load(ckpt, weights_only=True)["step"]
    assert 30 <= stopped_at < 300
    assert f"stopped after step {stopped_at}/300" in out

    proc = start(tiny_train(run_dir, ckpt_dir), tmp_path, tmp_path / "resume.log")
    out = finished(proc, tmp_path / "resume.log")
    assert proc.returncode == 0, out[-3000:]
    assert f"resuming from {ckpt} at step {stopped_at}/300" in out

    ref_out = finished(ref, tmp_path / "ref.log")
    assert ref.returncode == 0, ref_out[-3000:]
    got, want = arrays(run_dir), arrays(ref_dir)
    for key in ("loss", "eval_steps", "test_acc"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    for name, w in final_model(ref_ckpt).items():
        assert torch.equal(final_model(ckpt_dir)[name], w), name
    scalars = json.loads((run_dir / "result" / "result.json").read_text())["scalars"]
    assert scalars["steps"] == 300


def test_runaway_lr_is_diverged_and_a_truncated_checkpoint_is_moved_aside(cli):
    """Rows 12 and 11 as a user meets them: one sweep of lr 10 and lr 0.001, then its
    checkpoint truncated and the job rerun."""
    from conftest import runs_in

    ckpt_dir = cli.cwd / "ckpt"
    args = ("task=train", "width=16", "depth=2", "task.lrs=[10.0,0.001]", "task.steps=60",
            "task.eval_every=30", "task.log_every=30", f"task.checkpoint_dir={ckpt_dir}",
            f"data.cache_dir={DEFAULT_CACHE_DIR}")
    first = cli(*args)
    assert "lr=10 diverged at step" in first.stdout, first.stdout[-3000:]
    (run,) = runs_in(cli.uri)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["diverged_lr10"] == 1 and run.data.metrics["diverged_lr0.001"] == 0
    assert np.isnan(run.data.metrics["max_stable_lr"]) or run.data.metrics["max_stable_lr"] < 10

    (ckpt,) = ckpt_dir.glob("*.pt")
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    again = cli(*args, "tracking.resume=false")  # run the finished config again
    assert f"checkpoint {ckpt} is unreadable" in again.stdout, again.stdout[-3000:]
    assert f"moved it to {ckpt}.corrupt" in again.stdout
    assert "Traceback" not in again.stdout
    runs = runs_in(cli.uri)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    assert {r.data.metrics["final_test_acc_lr0.001"] for r in runs} == {
        run.data.metrics["final_test_acc_lr0.001"]}  # the restarted run trained the same
    assert Path(f"{ckpt}.corrupt").exists() and ckpt.exists()

