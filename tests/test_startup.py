"""A job's start-up runs without the cyclic garbage collector, its work with it
(:mod:`rankexp.startup`, issue 18 item 1): off while torch, Hydra and MLflow are imported and
the store is opened, on — with start-up's objects frozen — when the job computes, and on again
for an in-process caller whatever the command did."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

PROBE = """
import gc, json, runpy, sys
import rankexp.app, rankexp.tracking as tracking
seen = {}
configure, compute = tracking.configure_http, rankexp.app.Job._compute
def configure_http(*a, **k):  # MLflow's import: the heaviest of start-up
    seen["importing_mlflow"] = gc.isenabled()
    return configure(*a, **k)
def _compute(self, *a, **k):
    seen["computing"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
    return compute(self, *a, **k)
tracking.configure_http, rankexp.app.Job._compute = configure_http, _compute
sys.argv = ["rankexp", *sys.argv[1:]]
try:
    runpy.run_module("rankexp", run_name="__main__")
except SystemExit as e:
    seen["exit"] = e.code
print("SEEN", json.dumps(seen))
"""


def _probe(tmp_path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([sys.executable, "-c", PROBE, *args, f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("SEEN ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(line[-1][5:])


def test_start_up_without_the_collector_and_the_work_with_it(tmp_path):
    seen = _probe(tmp_path, "width=8", "depth=2", "seeds=1")
    assert seen["importing_mlflow"] is False
    assert seen["computing"] is True
    assert seen["frozen"] > 100_000  # torch, Hydra, MLflow: hundreds of thousands of objects


def test_an_in_process_caller_gets_its_collector_back(monkeypatch):
    """``rankexp.cli.cli()`` called in a process (tests, notebooks) switches the collector off
    for the command and on again, also when the command is refused."""
    import gc

    from rankexp import cli

    assert gc.isenabled()
    monkeypatch.setattr(sys, "argv", ["rankexp", "width=-3"])
    try:
        cli.cli()
    except SystemExit as e:
        assert e.code == 2
    assert gc.isenabled()
