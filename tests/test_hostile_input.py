"""Names are data, not paths; bad input is one line before anything exists (issue 22, rows 9, 10).

Each case ran on main — an IndexError with a sweep directory created, FAILED runs after the
data loaded, a Hugging Face traceback, the last of two values silently winning, an unused
value logged as a param, artifacts written outside the store — and now exits 2 with one line
naming the key and the rule, with no run and no sweep directory.
"""

from __future__ import annotations

import os
import re
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
    # … and these were a traceback, a FAILED run, a store error after the run, or ran to exit 0
    "a probe's count below its least": (
        ("task.options.representation.n=-3", "task.probes=[representation]"),
        "task.options.representation.n=-3 — must be an integer ≥ 2"),
    "a line break in a Slurm value": (
        ("hydra/launcher=slurm", 'hydra.launcher.comment="a\nb"', "depth=4,6", "-m"),
        "hydra.launcher.comment='a\\nb' — a line break ends its line"),
    "an experiment name over 255 bytes": (("tracking.experiment=" + "é" * 128,),
                                          "is 256 bytes long: at most 255"),
    "a plain net whose stream overflows": (("model=plain", "alpha=1e308"),
                                           "mean square 1 + (βα^M)²·L overflow a float64"),
    "a contour metric no probe logs": (
        ("hydra/sweeper=contour", "hydra.sweeper.contour.metric=erank_oi",
         "hydra.sweeper.contour.start=2", "-m"), "metric=erank_oi — no job logs it"),
    "options of a probe no job runs": (("task.options.representation.n=512",
                                        "task.probes=[stream],[io_jacobian]", "-m"),
                                       "not used: no job runs the probe representation"),
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


def test_bad_values_of_slurm_probes_and_scales_are_refused_in_process():
    """The rules behind the rows above, on both sides of each line: a line break in any Slurm
    value but ``setup``'s shell lines; options used when some job of the sweep runs their
    probe; the stream's mean square 1 + (βα^M)²·L in the narrowest float of the job (a float32
    measurement, a deep network); a probe's count at its least."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rankexp.cli import CONF_DIR
    from rankexp.config import ConfigError, check_options_used, check_slurm_limits, validate

    for bad in ({"comment": "a\nb"}, {"additional_parameters": {"mail_user": "a\r"}},
                {"srun_args": ["--x", "y\nz"]}):
        with pytest.raises(ConfigError, match="a line break ends its line"):
            check_slurm_limits(OmegaConf.create(bad))
    check_slurm_limits(OmegaConf.create({"setup": ["a", "b\nc"], "comment": "a b"}))

    def settings(*overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return validate(compose("config", overrides=["width=8", "seeds=1", *overrides]))

    for ok in (("model=plain", "alpha=1e150"), ("alpha=1e9", "dtype=float32"),
               ("alpha=1e76", "depth=2"), ("task.options.representation.n=2",)):
        settings(*ok)
    for bad, says in ((("model=plain", "alpha=1e160"), "a float64"),
                      (("alpha=1e17", "dtype=float32"), "a float32"),
                      (("alpha=1e76", "depth=100000"), "L=100000"),
                      (("task.options.representation.n=1",), "n=1 — must be an integer ≥ 2")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            settings(*bad)
    rep = settings("task.options.representation.n=512", "task.probes=[stream]")
    with pytest.raises(ConfigError, match="no job runs the probe representation"):
        check_options_used([rep])
    check_options_used([rep, settings("task.probes=[representation]")])  # a sweep: some job runs it


def test_the_metrics_a_probe_declares_are_the_ones_it_logs():
    """:attr:`Probe.metrics` (what the contour sweeper checks its metric against) is exactly
    what each residual-MLP probe that declares it logs on a small network."""
    from rankexp.models.mlp import ResidualMLP
    from rankexp.probes import PROBES
    from rankexp.tasks.measure import run_probes

    model, checked = ResidualMLP(6, 3, seeds=[0, 1]), 0
    for name, probe in PROBES.items():
        if probe.metrics is None or "mlp" not in probe.families or "measure" not in probe.tasks \
                or name == "norm_jacobian":  # (it needs norm=post)
            continue
        m = run_probes(model, [name])
        assert set(m.scalars) | set(m.series) == probe.metrics, name
        checked += 1
    assert checked >= 12 and "erank_io" not in PROBES["stream"].metrics
