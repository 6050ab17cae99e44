"""The entrypoint as users type it: sweeps, MLflow runs, heatmaps, bad input, failures, resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import runs_in

SMALL = ("width=24", "seeds=2")


def job_runs(uri, experiment="rankexp"):
    return [r for r in runs_in(uri, experiment) if r.data.tags.get("rankexp.role") != "sweep"]


def test_issue_sweep_leaves_four_finished_runs_and_a_heatmap(cli):
    cli("norm=post", "alpha=1,2", "depth=48,96", "-m", *SMALL)
    runs = job_runs(cli.uri)
    assert len(runs) == 4
    assert {r.info.status for r in runs} == {"FINISHED"}
    grid = {(r.data.params["alpha"], r.data.params["depth"]) for r in runs}
    assert grid == {("1.0", "48"), ("1.0", "96"), ("2.0", "48"), ("2.0", "96")}
    parents = [r for r in runs_in(cli.uri) if r.data.tags.get("rankexp.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    client_runs = {r.info.run_id: r for r in runs}
    for r in runs:
        m, p, t = r.data.metrics, r.data.params, r.data.tags
        for key in (
            "erank_io",
            "stable_rank_io",
            "erank_profile",
            "rms",
            "branch_ratio",
            "erank_profile_std",  # a series keeps its band partner
        ):
            assert key in m, key
        # a scalar's seed spread is a tag, not a second chart (issue 9 row 8)
        assert "erank_io_std" not in m and float(t["seed_std.erank_io"]) >= 0
        # params are what defines the experiment
        assert not [k for k in p if k.startswith(("tracking.", "data.")) or k in ("lr", "device")]
        # MLflow's system tags: Source, Created by, the commit (+ whether the tree was dirty)
        assert t["mlflow.source.name"] == "rankexp" and t["mlflow.source.type"] == "LOCAL"
        assert t["mlflow.user"] and len(t["mlflow.source.git.commit"]) == 40
        assert t["rankexp.git_dirty"] in ("true", "false")
        assert 0 < m["erank_io"] <= 1 and 1 <= m["stable_rank_io"] <= 24
        assert p["norm.placement"] == "post" and p["width"] == "24"
        assert float(p["nominal_ratio"]) == pytest.approx(float(p["alpha"]) ** 2)
        assert float(p["depth_factor"]) == pytest.approx(
            float(p["alpha"]) ** 2 * float(p["depth"]) ** 0.5
        )
        for tag in ("config_hash", "git_commit", "overrides", "sweep_id", "device"):
            assert t[tag], tag
        assert t["mlflow.parentRunId"] == parents[0].info.run_id
        assert "norm=post" in t["overrides"]
    # names from the swept axes (the norm= choice leads), the parent by experiment and time
    assert sorted(r.info.run_name for r in runs) == ["post·α1·L48", "post·α1·L96",
                                                     "post·α2·L48", "post·α2·L96"]
    assert parents[0].info.run_name.startswith("rankexp·20")
    note = parents[0].data.tags["mlflow.note.content"]
    assert "python -m rankexp norm=post alpha=1,2 depth=48,96" in note
    # the per-layer series are logged with step = layer, and equal the job-dir result
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cli.uri)
    rid = next(iter(client_runs))
    hist = sorted(client.get_metric_history(rid, "erank_profile"), key=lambda x: x.step)
    depth = int(client_runs[rid].data.params["depth"])
    assert [h.step for h in hist] == list(range(1, depth + 1))
    job_dir = Path(client_runs[rid].data.tags["job_dir"])
    saved = json.loads((job_dir / "result" / "result.json").read_text())
    assert saved["series"]["erank_profile"]["values"] == pytest.approx(
        [h.value for h in hist], rel=1e-12
    )
    assert saved["scalars"]["erank_io"] == pytest.approx(
        client_runs[rid].data.metrics["erank_io"], rel=1e-12
    )
    artifacts = {a.path for a in client.list_artifacts(rid)}
    assert {"config.yaml", "result.json", "arrays.npz"} <= artifacts
    # deeper and larger α collapse more (post-norm)
    er = {
        (float(r.data.params["alpha"]), int(r.data.params["depth"])): r.data.metrics["erank_io"]
        for r in runs
    }
    assert er[(2.0, 96)] < er[(1.0, 48)]

    out = cli("heatmap", "--experiment", "rankexp", module="analysis")
    figdir = cli.cwd / "figures" / "rankexp"
    stem = "heatmap_erank_io_depth_x_alpha"
    for ext in ("png", "pdf", "csv"):
        assert (figdir / f"{stem}.{ext}").stat().st_size > 0, out.stdout
    table = pd.read_csv(figdir / f"{stem}.csv")
    assert len(table) == 4 and (table["count"] == 1).all()
    assert sorted(table["mean"]) == pytest.approx(sorted(er.values()), rel=1e-12)
    # each cell's spread is its run's seeds' (issue 32 item 5: not an empty std over one run)
    spread = sorted(float(r.data.tags["seed_std.erank_io"]) for r in runs)
    assert sorted(table["std"]) == pytest.approx(spread, rel=1e-12) and min(spread) > 0
    assert (table["seeds"] == int(runs[0].data.params["seeds"])).all() and len(runs) == 4


SLOW = pytest.mark.slow  # the same check for another key of the same kind: -m slow
BAD = [
    ("depth=0", "depth"),
    pytest.param("width=-4", "width", marks=SLOW),
    pytest.param("alpha=0", "alpha", marks=SLOW),
    pytest.param("expansion=0", "expansion", marks=SLOW),
    ("matrices=3", "matrices"),
    pytest.param("activation=foo", "activation", marks=SLOW),
    ("norm=sideways", "norm"),
    ("norm.op=magic", "op"),
    pytest.param("seeds=0", "seeds", marks=SLOW),
    pytest.param("beta_scaling=cube", "beta_scaling", marks=SLOW),
]


@pytest.mark.parametrize("override,key", BAD)
def test_bad_input_fails_before_any_run(cli, override, key):
    value = override.split("=", 1)[1]
    small = [o for o in ("depth=4", "width=8") if o.split("=")[0] != key]  # each key once
    p = cli(override, *small, check=False)
    assert p.returncode == 2
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid config: "), p.stdout[-2000:]
    assert key in lines[0] and value in lines[0], p.stdout[-2000:]
    assert any(w in lines[0] for w in ("allowed: ", "must be", "M = 1 or M = 2")), lines[0]
    assert job_runs(cli.uri) == []
    assert made_dirs(cli.cwd) == []


def made_dirs(cwd: Path) -> list[str]:
    """The run and sweep directories under ``cwd`` (``outputs/…``, ``multirun/…``)."""
    return sorted(str(p.relative_to(cwd)) for d in ("outputs", "multirun") for p in cwd.glob(f"{d}*/**"))


def test_a_refused_config_leaves_no_directory(cli):
    """Issue 19: a single run refused for its value (``alpha=abc`` by OmegaConf while composing,
    ``width=-3`` by the task's check) left an empty ``outputs/<date>/<time>`` behind — Hydra
    makes it before the task starts.  Now the check runs before it (rankexp.cli.CheckFirst)
    and a run refused by its store removes what Hydra made: no directory for any case of
    test_bad_input_fails_before_any_run (single runs) or the file store below, nor for a
    refused sweep here.  A config that passes makes its directory (the check sees one)."""
    for bad in ("alpha=abc", "width=-3"):
        p = cli(bad, "depth=2", *(["width=8"] if "width" not in bad else []), "-m", check=False)
        assert p.returncode == 2 and p.stdout.startswith("error: "), p.stdout[-2000:]
        assert made_dirs(cli.cwd) == [], (bad, made_dirs(cli.cwd))
    cli("depth=1", "width=4", "seeds=1", "task.probes=[stream]", "tracking.enabled=false")
    assert [d for d in made_dirs(cli.cwd) if d.count("/") == 2], made_dirs(cli.cwd)


def test_a_job_logs_one_info_line_and_each_probe_with_its_own_time_at_debug(cli):
    """Issue 32 row 8: a job printed 7–8 INFO lines, and ``probe io_jacobian`` stood for the
    probes' shared forward sweep, then three probes printed within a second.  Now one INFO
    line: the job's name, headline and time; with ``hydra.verbose=rankexp`` the shared sweep,
    then each probe, logged as it starts and again with its own time when it ends."""
    from rankexp.probes import DEFAULT_PROBES

    out = cli("depth=4", "width=8", "seeds=2", "tracking.enabled=false",
              "hydra.verbose=rankexp").stdout.splitlines()
    info = [ln for ln in out if "][INFO] - " in ln]
    assert len(info) == 1, out
    assert re.search(r"\] - \S+·L4·d8 finished in \d+\.\ds: erank_io=[\d.]+, stable_rank_io=[\d.]+$",
                     info[0]), info
    steps = [ln.split("][DEBUG] - ")[1] for ln in out if "][DEBUG] - " in ln]
    steps = [s for s in steps if s.startswith(("probe ", "forward sweep "))]
    names = ["forward sweep for branch_norms, io_jacobian, partial_spectra",
             *(f"probe {p}" for p in DEFAULT_PROBES)]
    assert [s.rsplit(":", 1)[0] if s.endswith(" s") else s for s in steps] == \
        [s for n in names for s in (f"{n} …", n)], steps
    assert all(re.fullmatch(r".+: \d+\.\d\d s", s) for s in steps[1::2]), steps

def test_file_store_uri_is_refused_with_a_clear_message(cli):
    p = cli("depth=2", "width=8", f"tracking.uri=file://{cli.cwd}/mlruns", check=False)
    assert p.returncode != 0
    assert "file store" in p.stdout and "sqlite" in p.stdout
    assert not (cli.cwd / "mlruns").exists()
    assert made_dirs(cli.cwd) == []


def test_stale_mlruns_does_not_hijack_the_default_store(cli):
    stale = cli.cwd / "mlruns" / "0"
    stale.mkdir(parents=True)
    (stale / "meta.yaml").write_text("name: Default\n")
    cli("depth=2", "width=8", "seeds=1")
    assert len(job_runs(cli.uri)) == 1


def test_one_failing_job_does_not_stop_the_sweep_and_is_recorded_failed(cli):
    """task.options.branch_jacobian.layers=[9] passes every check before a run (a list the
    probe reads against the depth) and the probe refuses it while computing: that job's run is
    FAILED with the error as a tag, the other jobs finish, the sweep exits non-zero.  (A network
    too large for the machine, v1's example here, is refused before any run now:
    tests/test_memory.py; so is stream.inputs=0, its example after: tests/test_hostile_input.py.)"""
    p = cli("task.options.branch_jacobian.layers=[9],null", "depth=1,2", "width=8", "seeds=2",
            "task.probes=[branch_jacobian]", "-m", check=False)
    assert p.returncode != 0
    runs = job_runs(cli.uri)
    status = sorted(r.info.status for r in runs)
    assert status == ["FAILED", "FAILED", "FINISHED", "FINISHED"], status
    failed = [r for r in runs if r.info.status == "FAILED"]
    assert all("[9] outside" in r.data.tags["error"] for r in failed), [r.data.tags for r in failed]
    parent = [r for r in runs_in(cli.uri) if r.data.tags.get("rankexp.role") == "sweep"][0]
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["jobs_failed"] == 2 and parent.data.metrics["jobs_finished"] == 2
    assert "2 finished, 0 skipped (already FINISHED), 2 failed, 0 killed, 0 not run" in p.stdout
    assert p.returncode == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_missing_cuda_is_a_clear_error_before_any_run(cli):
    p = cli("device=cuda", "depth=2", "width=8", check=False)
    assert p.returncode == 2 and "device='cuda'" in p.stdout
    assert job_runs(cli.uri) == []


def test_rerun_skips_finished_configs_and_force_reruns(cli):
    cli("alpha=1,2", "depth=3", "-m", *SMALL)
    assert len(job_runs(cli.uri)) == 2
    p = cli("alpha=1,2,3", "depth=3", "-m", *SMALL)
    assert "2 skipped" in p.stdout
    assert len(job_runs(cli.uri)) == 3
    old = {r.data.tags["config_hash"]: r.info.run_id for r in job_runs(cli.uri)}
    cli("alpha=1", "depth=3", "tracking.force=true", "tracking.run_name=rerun", *SMALL)
    # issue 28 row 9: the rerun supersedes the config's old run (before: two FINISHED runs)
    runs = job_runs(cli.uri)
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3
    (new,) = [r for r in runs if r.info.run_name == "rerun"]
    gone = runs_in(cli.uri, run_view_type=3)  # all: the old one, soft-deleted
    (was,) = [r for r in gone if r.info.run_id == old[new.data.tags["config_hash"]]]
    assert was.info.lifecycle_stage == "deleted" and was.data.tags["rankexp.superseded_by"] == new.info.run_id


# --------------------------------------------------------------------------- help and tab
HEAVY = ("torch", "mlflow", "transformers", "torchvision")


def _imports(*args: str, line: str | None = None, code: str | None = None) -> tuple[str, list[str]]:
    """stdout of a fresh ``python -X importtime -m rankexp args`` (or ``-c code``) and the modules
    it imported that a help or a tab press must not: torch, mlflow, … and model code."""
    import os
    import subprocess
    import sys

    from rankexp.models import TORCH_FREE

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    if line is not None:
        env.update(COMP_LINE=line, COMP_POINT=str(len(line)))
    cmd = ["-c", code] if code else ["-m", "rankexp", *args]
    p = subprocess.run([sys.executable, "-X", "importtime", *cmd], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    names = [ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")]
    return p.stdout, sorted(n for n in names if n.split(".")[0] in HEAVY
                            or (n.startswith("rankexp.models.") and not n.startswith(TORCH_FREE)))


def test_help_and_a_tab_press_import_no_torch_mlflow_or_model_code():
    """Issue 19 row 1: `rankexp --help` took 16 s (torch through rankexp.config → models.gpt2)
    and a tab press 5.7–10 s.  Both now read torch-free modules only (the time: make bench,
    benchmarks/job.py).  The check sees torch where it is imported."""
    out, heavy = _imports("--help")
    assert "Knobs" in out and "depth=48" in out and heavy == []
    out, heavy = _imports("task=train", "model=gpt2", "--help")
    assert "Knobs" in out and heavy == []
    for line, reply in (("rankexp nor", "norm="), ("rankexp norm=p", "norm=post"),
                        ("rankexp task=train task.ba", "task.batch_size=")):
        out, heavy = _imports("-sc", "query=bash", line=line)
        assert reply in out.split() and heavy == [], (line, out)
    _, heavy = _imports(code="import rankexp.models.mlp")
    assert "torch" in heavy and "rankexp.models.mlp" in heavy


def test_help_into_a_pipe_its_reader_closed_ends_quietly():
    """`rankexp --help | head -1`: the reader leaves after one line; the help ends with
    128+SIGPIPE and no traceback (before: ``BrokenPipeError`` printed to the terminal)."""
    import os
    import signal
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the help writes: every write meets EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "rankexp", "--help"], stdout=write,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write)
    err = proc.stderr.decode()
    assert proc.returncode == 128 + signal.SIGPIPE and "Traceback" not in err, (proc.returncode, err)


def test_a_tab_press_offers_no_internal_config_group():
    """Issue 19: `rankexp <TAB>` offered ``schema/``, the structured configs the groups'
    YAML files extend (now root configs in no group: rankexp.config.register_configs); the
    groups and keys a user sets are all still offered."""
    for line in ("rankexp ", "rankexp s", "rankexp task=train "):
        out, _ = _imports("-sc", "query=bash", line=line)
        words = out.split()
        assert words and not [w for w in words if "schema" in w], (line, words)
        assert ("seeds=" in words and "size=" in words) if line.endswith("s") else \
            {"norm=", "task=", "model=", "experiment=", "size=", "depth="} <= set(words), (line, words)


QUIET_PROBE = """
import sys
sys.argv = ["rankexp", "--cfg", "job"]
from rankexp.cli import cli
try:
    cli()
except SystemExit:
    pass
from huggingface_hub.utils import are_progress_bars_disabled
from mlflow.utils.file_utils import ArtifactProgressBar
print("BARS", ArtifactProgressBar.files(desc="Downloading artifacts", total=3).pbar is not None,
      not are_progress_bars_disabled())
"""


@pytest.mark.parametrize("user", [None, "true"])
def test_a_job_console_gets_no_third_party_progress_bars(user):
    """Issue 19 row 8: MLflow's "Downloading artifacts" bars and Hugging Face's download and
    checkpoint bars are off in a rankexp process (their own switches), unless the user turns
    MLflow's back on."""
    last = _probe_line(QUIET_PROBE, {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": user},
                       unset=("HF_HUB_DISABLE_PROGRESS_BARS",))
    assert last == f"BARS {user == 'true'} False"


def _probe_line(code: str, given: dict[str, str | None], unset: tuple[str, ...] = ()) -> str:
    """The last stdout line of ``python -c code`` in a fresh process whose environment has the
    ``given`` variables (``None``: left unset) and none of ``unset``."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in (*given, *unset)}
    env.update({k: v for k, v in given.items() if v is not None})
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


EXIT_PROBE = """
import os, sys
sys.argv = ["rankexp", "--cfg", "job"]
from rankexp.cli import cli
try:
    cli()
except SystemExit:
    pass
print("EXIT", os.environ.get("MLFLOW_DISABLE_TELEMETRY"), os.environ.get("HYDRA_FULL_ERROR"))
"""


@pytest.mark.parametrize("user", [None, "false"])
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(user):
    """MLflow 3's telemetry thread is off unless the user turns it on; the command leaves
    ``HYDRA_FULL_ERROR`` as it found it (rankexp.cli sets it while Hydra runs)."""
    assert _probe_line(EXIT_PROBE, {"MLFLOW_DISABLE_TELEMETRY": user}) == f"EXIT {user or 'true'} None"


LIGHT = """
import sys
from hydra import compose, initialize_config_dir
from rankexp import cli, helptext
from rankexp.config import check_override_keys, check_task, config_groups
from rankexp.memory import seed_bytes
from rankexp.naming import config_name
check_override_keys(["depth=4", "norm=post"], config_groups(cli.CONF_DIR))
for overrides in (["experiment=fig5", "size=smoke"], ["model=gpt2", "width=64", "depth=2"],
                  ["model=cifar_resnet", "depth=8", "task.probes=[init_gradient_norms]"],
                  ["task=train", "data.download=true"]):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose("config", [*overrides, "device=auto"], return_hydra_config=True)
    checked = check_task(cfg)
    config_name(checked.settings)
    if checked.settings.task.name == "measure":
        seed_bytes(checked.settings)
helptext.probes()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "mlflow", "transformers",
               "torchvision", "sqlalchemy") or m.startswith(("rankexp.models.", "rankexp.probes.base",
               "rankexp.tasks", "rankexp.app"))
         and not m.startswith(("rankexp.models.spec", "rankexp.models.families")))
print("HEAVY", heavy)
"""


def test_composing_and_checking_a_config_imports_no_torch_mlflow_or_model():
    """The schema, the checks (keys, values, paths, device, memory estimate), run names and the
    probes' help read torch-free modules only: a sweep's check, `--help` and a tab press never
    import torch (the job imports it once, when it builds its network)."""
    assert _probe_line(LIGHT, {}) == "HEAVY []"


COUNTER = """
import sys
import rankexp.config.checks as checks
calls = []
check = checks.check_job
def counted(*a, **k):
    calls.append(1)
    return check(*a, **k)
checks.check_job = counted
from rankexp import cli
sys.argv = ["rankexp", *sys.argv[1:]]
try:
    cli.cli()
except SystemExit as e:
    print("EXIT", e.code)
print("CHECKS", len(calls))
"""


def test_each_job_of_a_sweep_is_checked_once(tmp_path):
    """The sweeper checks every job before the first runs; a job of the basic launcher takes
    that check (rankexp.config.CHECKED_JOBS) instead of checking again; a job whose config an
    earlier job has (``alpha=2`` and ``alpha=2.0``) is left out."""
    import subprocess
    import sys

    from services import clean_env

    out = subprocess.run([sys.executable, "-c", COUNTER, "width=8", "depth=2", "seeds=1",
                          "tracking=off", "task.probes=[io_jacobian]", "alpha=1,2,2.0",
                          f"hydra.sweep.dir={tmp_path}/sweep", "-m"],
                         cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "CHECKS 3", out.stdout[-2000:] + out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1"]
    assert "left out alpha=2.0" in out.stdout


def test_make_help_lists_every_target_in_plain_words():
    """Issue 19 leftovers: `make help` printed `$(REPRODUCE)`, left out `lint` and called `sweep`
    "the issue's sweep".  Every .PHONY target is listed, variables as make sees them."""
    import re
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    make = (root / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", make, re.M)[1].split()
    assert shutil.which("make"), "make is part of the two commands (README)"
    out = subprocess.run(["make", "-s", "-C", str(root), "help"], capture_output=True, text=True,
                         check=True).stdout
    listed = [line.split("\t")[0] for line in out.splitlines()]
    assert sorted(listed) == sorted(phony), out
    assert "$(" not in out and "issue" not in out, out
    reproduce = re.search(r"^REPRODUCE \?= (\S+)", make, re.M)[1]
    port = re.search(r"^UI_PORT +\?= (\S+)", make, re.M)[1]
    assert f"({reproduce}/report/report.html)" in out and f"http://127.0.0.1:{port} " in out
    other = subprocess.run(["make", "-s", "-C", str(root), "help", "REPRODUCE=elsewhere"],
                           capture_output=True, text=True, check=True).stdout
    assert "(elsewhere/report/report.html)" in other


def test_the_readme_has_no_leftovers():
    """A literal SMOKE_PLACEHOLDER sat in the README; nor should notes to its writers."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    left = re.findall(r"\b(?:[A-Z]+_PLACEHOLDER|TODO|FIXME|XXX|TBD)\b|the issue's|lent to this task",
                      readme)
    assert left == [], left
