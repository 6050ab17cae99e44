"""Names are data, not paths; bad input is one line before anything exists (issue 22, rows 9, 10).

Each case ran on main — an IndexError with a sweep directory created, FAILED runs after the
data loaded, a Hugging Face traceback, the last of two values silently winning, an unused
value logged as a param, artifacts written outside the store — and now exits 2 with one line
naming the key and the rule, with no run and no sweep directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import runs_in

from rankexp import tracking


def nothing_created(cwd: Path) -> None:
    """No sweep directory, no job files (Hydra's own ``outputs/…/.hydra`` of a single run is
    written before any rankexp code runs), no run."""
    assert not list(cwd.glob("multirun/*/*")), list(cwd.rglob("*"))
    assert not [p for p in cwd.rglob("*.json") if p.name in ("run.json", "status.json")]
    db = cwd / "mlflow.db"
    assert not db.exists() or not runs_in(f"sqlite:///{db}")


BAD = {  # override(s) → what the one line must say
    "empty sweep": (("depth=range(4,4)", "-m"), "the sweep has no jobs"),
    "batch larger than CIFAR-10": (("task=train", "task.batch_size=1000000"),
                                   "task.batch_size=1000000 — a batch is drawn from CIFAR-10's 50000"),
    "missing checkpoint": (("model=gpt2", "model.pretrained=/nonexistent", "width=64", "depth=2",
                            "seeds=1"), "model.pretrained='/nonexistent' — no such directory"),
    "a key twice": (("depth=4", "depth=8"), "'depth' is given twice ('depth=4', 'depth=8')"),
    "a key twice in a sweep": (("depth=4,6", "width=8", "depth=8", "-m"), "'depth' is given twice"),
    "a value the task does not use": (("lr=0.1",), "lr=0.1 — not used: task=measure does not train"),
    "options of a store that is off": (("tracking=off", "tracking.uri=garbage://x"),
                                       "tracking.uri=garbage://x — not used: the store is off"),
    "a path for a name": (("tracking.experiment=../../escape",), "is a name, not a path"),
    "a name that is a path component": (("tracking.experiment=..",), "is a name, not a path"),
    "unicode inside a structure": (("task.probes=[é]",), "Hydra reads non-ASCII characters only inside quotes"),
    # issue 28 row 6: each was a traceback after the run existed, or joblib's ValueError
    "a file for the data": (("task=train", "data.root=/etc/passwd"),
                            "data.root='/etc/passwd' — /etc/passwd is a file, not a CIFAR-10 source"),
    "a folder without CIFAR-10": (("task=train", "data.root=/etc"), "CIFAR-10 not found: /etc holds no"),
    "a file for the checkpoints": (("task=train", "task.checkpoint_dir=/etc/passwd"),
                                   "/etc/passwd is a file; checkpoints need a folder"),
    "a branch scale that overflows": (("alpha=1e308",), "alpha=1e+308 — the branch scale βα^M"),
    "no joblib workers": (("hydra/launcher=local", "hydra.launcher.n_jobs=0", "depth=4,6", "-m"),
                          "hydra.launcher.n_jobs=0: joblib runs no job with 0 workers"),
    # issue 28 row 9: the name's second line was a log line of its own ("… finished")
    "a run name of two lines": (("tracking.run_name='x\n[INFO] - all 8 jobs FINISHED'",),
                                "must be a non-empty name on one line"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_hostile_input_is_one_line_and_creates_nothing(case, cli):
    args, said = BAD[case]
    small = [] if any(a.startswith(("width", "depth=4,6")) for a in args) else ["width=8"]
    p = cli(*args, *small, check=False)
    assert p.returncode == 2, p.stdout[-3000:]
    assert said in p.stdout, p.stdout[-3000:]
    assert "Traceback" not in p.stdout, p.stdout[-3000:]
    assert len([line for line in p.stdout.splitlines() if line.strip()]) <= 3, p.stdout[-3000:]
    nothing_created(cli.cwd)
    assert not (cli.cwd.parent / "escape").exists()


def test_unicode_names_work_with_and_without_quotes(cli):
    """Before: Hydra's lexer error, no hint to quote.  Now ``tracking.experiment=résumé`` is
    read as typed (quoted for Hydra by rankexp), and so is the quoted form; the experiment's
    artifacts live in the artifact root under its name."""
    for name, arg in (("résumé", "tracking.experiment=résumé"), ("日本", "tracking.experiment='日本'")):
        cli(arg, "width=8", "depth=2", "seeds=1", "task.probes=[io_jacobian]")
        (run,) = runs_in(cli.uri, name)
        assert run.info.status == "FINISHED"
        where = Path(unquote(run.info.artifact_uri.removeprefix("file://")))
        assert (cli.cwd / "mlartifacts" / name) in where.parents, where
    p = cli("tracking.experiment=a,résumé", "width=8", "depth=2", "seeds=1", "task.probes=[io_jacobian]",
            "-m")
    assert "1 finished, 1 skipped (already FINISHED)" in p.stdout, p.stdout[-2000:]  # résumé's resumed
    assert len(runs_in(cli.uri, "a")) == 2 and len(runs_in(cli.uri, "résumé")) == 1  # (a: + its parent)


def test_an_experiment_name_never_leaves_the_artifact_root(tmp_path):
    """The store's own guard, for names that reach it from elsewhere (a job directory's
    run.json read by sync): a path, ``..``, a symlink out of the artifact root."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    for name in ("../../escape", "..", "a/b", " padded", "tab\there"):
        with pytest.raises(tracking.TrackingError, match="experiment name"):
            tracking.prepare_experiment(uri, name)
    root = tmp_path / "store" / "mlartifacts"
    root.mkdir()
    os.symlink(tmp_path / "elsewhere", root / "linked")
    with pytest.raises(tracking.TrackingError, match="outside the store's artifact root"):
        tracking.prepare_experiment(uri, "linked")
    assert tracking.prepare_experiment(uri, "fig6 ablation: β=1÷√L")  # any other text is a name


def test_metric_keys_are_sanitised_into_names_mlflow_accepts(tmp_path):
    """:func:`rankexp.tracking.metric_key`, the one mapping: names MLflow accepts unchanged,
    the others into names it accepts (checked by logging both to a real store)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    assert tracking.metric_key("erank_io") == "erank_io"
    assert tracking.metric_key("train_loss_lr0.001") == "train_loss_lr0.001"
    assert tracking.metric_key("train_loss_lr1e+06") == "train_loss_lr1e06"
    assert tracking.metric_key("test_acc_lr3e-05") == "test_acc_lr3e-05"
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = c.create_run(c.create_experiment("keys")).info.run_id
    for raw in ("train_loss_lr1e+06", "a+b", "../up", "/root", "x//y", "q?", "é%"):
        with pytest.raises(MlflowException):
            c.log_metric(run, raw, 1.0)
        c.log_metric(run, tracking.metric_key(raw), 1.0)
    assert len(c.get_run(run).data.metrics) == 7
