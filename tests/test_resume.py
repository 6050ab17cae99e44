"""Resume after an interrupted sweep: the same command again runs only what did not finish.

The sweep is interrupted from outside, as a user's Ctrl-C does it: SIGINT to the sweep's
whole process group once two of its four runs are FINISHED in the store (polled) — either
at once (the interrupt then lands while Hydra sets up job 3) or once job 3's run exists
and is computing."""

from __future__ import annotations

import os
import signal
import time

import pytest
from services import clean_env, finish, rankexp, start_rankexp, sweep_runs

# Hydra's basic launcher runs the jobs one after another in this order: two cheap jobs
# (L=4), then two that take a few seconds each (L=96), so job 3 can be caught running.
SWEEP = ("norm=post", "depth=4,96", "alpha=1,2", "width=32", "seeds=1", "-m")
GRID = {("4", "1.0"), ("4", "2.0"), ("96", "1.0"), ("96", "2.0")}


def statuses(uri: str) -> list[str]:
    return sorted(r.info.status for r in sweep_runs(uri)[1])


def interrupt_after_two_finished(tmp_path, uri: str, env: dict, in_job: bool):
    """Start the sweep, poll its store, SIGINT its process group; returns its Result."""
    proc = start_rankexp(*SWEEP, cwd=tmp_path, env=env)
    deadline = time.monotonic() + 240
    seen = None
    while proc.poll() is None and time.monotonic() < deadline:
        # poll only once the sweep has created the store (no schema race with it)
        if list(tmp_path.glob("multirun/*/*/mlflow_parent.json")):
            now = statuses(uri)
            if now.count("FINISHED") >= 2 and (not in_job or "RUNNING" in now):
                os.killpg(proc.pid, signal.SIGINT)
                seen = now
                break
        time.sleep(0.05)
    result = finish(proc, timeout=60)  # a Ctrl-C'ed sweep must stop promptly
    expected = ["FINISHED", "FINISHED", "RUNNING"] if in_job else ["FINISHED", "FINISHED"]
    assert seen == expected, (seen, result.output[-3000:])
    assert result.returncode != 0, result.output[-3000:]
    return result


@pytest.mark.parametrize("in_job", [True, False], ids=["in-job-3", "before-job-3"])
def test_interrupted_sweep_resumes_with_only_the_unfinished_runs(tmp_path, in_job):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = clean_env()
    first = interrupt_after_two_finished(tmp_path, uri, env, in_job)

    parents, after_interrupt = sweep_runs(uri)
    (parent,) = parents
    assert statuses(uri).count("FINISHED") == 2, statuses(uri)
    if in_job:
        # job 3's run was closed as KILLED by the interrupt, and the sweep's parent FAILED
        assert statuses(uri) == ["FINISHED", "FINISHED", "KILLED"], statuses(uri)
        assert parent.info.status == "FAILED", parent.info.status
        assert "2 finished, 0 skipped (already FINISHED), 1 failed" in first.output
    else:
        # jobs 3 and 4 never started: the parent says KILLED (ended early), not FINISHED
        assert statuses(uri) == ["FINISHED", "FINISHED"], statuses(uri)
        assert parent.info.status == "KILLED", parent.info.status
        assert "ended early" in parent.data.tags.get("error", ""), parent.data.tags
        assert "2 finished, 0 skipped (already FINISHED), 0 failed; ended early" in first.output

    # the same command again: two new runs, the two finished configs skipped
    second = rankexp(*SWEEP, cwd=tmp_path, env=env, timeout=300).check()
    assert "2 finished, 2 skipped (already FINISHED), 0 failed" in second.output, second.output
    after_second = sweep_runs(uri)[1]
    new = {r.info.run_id for r in after_second} - {r.info.run_id for r in after_interrupt}
    assert len(new) == 2, new
    finished = [r for r in after_second if r.info.status == "FINISHED"]
    assert len(finished) == 4
    assert {(r.data.params["depth"], r.data.params["alpha"]) for r in finished} == GRID
    assert len({r.data.tags["config_hash"] for r in finished}) == 4
    timing = f"sweep, rerun: {first.seconds:.1f} s, {second.seconds:.1f} s"
    if in_job:
        # and again: nothing left to do
        third = rankexp(*SWEEP, cwd=tmp_path, env=env, timeout=300).check()
        assert "0 finished, 4 skipped (already FINISHED), 0 failed" in third.output, third.output
        assert third.output.count("skipping: this config") == 4
        assert {r.info.run_id for r in sweep_runs(uri)[1]} == {r.info.run_id for r in after_second}
        timing += f", rerun: {third.seconds:.1f} s"
    print(timing)
