"""Mistakes fail before anything runs (issue 8, rows 5–8 and item 4): unknown keys (``+key``
included) with a did-you-mean, input paths, the whole sweep, the store — each one message
naming key, value or path and what is allowed, exit status 2, no run, no traceback."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import runs_in
from hydra import compose, initialize_config_dir

from rankexp import tracking
from rankexp.cli import CONF_DIR
from rankexp.config import (
    ConfigError,
    check_job,
    check_override_keys,
    check_slurm_limits,
    config_groups,
    slurm_signal_delay,
)

GROUPS = config_groups(CONF_DIR)


@pytest.mark.parametrize("override,hint", [
    ("deph=4", "did you mean 'depth'"),
    ("+deph=4", "did you mean 'depth'"),
    ("task.stepz=5", "did you mean 'task.steps'"),
    ("data.rot=x", "did you mean 'data.root'"),
    ("trackng.uri=x", "did you mean 'tracking'"),
    ("depth.x=1", "'depth' is a value"),
])  # fmt: skip
def test_unknown_keys_are_refused_with_a_suggestion(override, hint):
    with pytest.raises(ConfigError, match="invalid config") as e:
        check_override_keys([override], GROUPS)
    assert hint in str(e.value)


@pytest.mark.parametrize("override", [
    "depth=4", "norm=post", "norm.op=layernorm", "experiment=fig5", "task.steps=5",
    "task.options.stream.inputs=64", "hydra.launcher.n_jobs=2", "hydra/launcher=slurm",
])  # fmt: skip
def test_known_keys_and_groups_pass(override):
    check_override_keys([override], GROUPS)


def test_a_composed_plus_key_is_refused():
    """Keys added by a config file (not the command line) are checked after composition."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["+deph=4", "task.options.stream.inputs=3"])
    with pytest.raises(ConfigError, match="unknown key 'deph' — did you mean 'depth'"):
        check_job(cfg)


def test_signal_delay_follows_the_time_limit():
    assert [slurm_signal_delay(m) for m in (0.5, 1, 10, 60, 240)] == [15, 15, 60, 120, 120]
    assert slurm_signal_delay(1) < 60 / 2 + 1
    from omegaconf import OmegaConf

    check_slurm_limits(OmegaConf.create({"timeout_min": 1, "signal_delay_s": 15}))
    with pytest.raises(ConfigError, match="signal_delay_s=120 — not below the time limit"):
        check_slurm_limits(OmegaConf.create({"timeout_min": 1, "signal_delay_s": 120}))


def test_store_problems_are_one_message_naming_the_store(tmp_path):
    tracking.configure_http(retries=0, timeout_s=2, backoff=0)
    cases = {
        "garbage://x": "MLflow knows no store for this URI scheme",
        f"sqlite:///{tmp_path}/missing/dir/mlflow.db": f"the folder {tmp_path}/missing/dir does not exist",
        "http://127.0.0.1:9": "does not answer (connection refused)",
    }
    bad = tmp_path / "not-a-db"
    bad.write_text("hello, I am not SQLite\n")
    cases[f"sqlite:///{bad}"] = f"{bad} is not an SQLite database"
    good = tmp_path / "good.db"
    tracking.check_store(f"sqlite:///{good}")  # creates a fresh store
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(good.read_bytes()[:3000])
    cases[f"sqlite:///{truncated}"] = f"{truncated} cannot be used as an MLflow store"
    for uri, message in cases.items():
        with pytest.raises(tracking.TrackingError) as e:
            tracking.check_store(uri)
        assert message in str(e.value), (uri, str(e.value))
        assert "\n" not in str(e.value)
    with sqlite3.connect(good) as c:  # a store on a local disk uses SQLite's write-ahead log
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_typo_and_missing_data_fail_before_any_run(cli):
    """Rows 5 and 6: ``+deph=4`` ran the defaults as a FINISHED run; ``data.root=/nonexistent``
    created a FAILED run.  Now both exit 2 with one line, and the store stays empty."""
    p = cli("depth=2", "width=16", "+deph=4", check=False)
    assert p.returncode == 2 and "unknown key 'deph' — did you mean 'depth'?" in p.stdout
    p = cli("task=train", "depth=2", "width=8", "data.root=/nonexistent", check=False)
    assert p.returncode == 2, p.stdout[-2000:]
    assert "data.root='/nonexistent' — no such file or directory" in p.stdout
    assert "Traceback" not in p.stdout
    assert runs_in(cli.uri) == []


def test_a_sweep_with_bad_jobs_lists_each_and_starts_nothing(cli):
    """Row 7: ``matrices=1,3`` and ``depth=4,0`` ran the valid jobs, then failed the others
    with tracebacks and no run, and closed the parent KILLED.  Now every bad combination is
    listed, the exit status is 2, and nothing exists: no run, no sweep directory, no store."""
    p = cli("matrices=1,3", "depth=4,0", "width=8", "seeds=1", "-m", check=False)
    assert p.returncode == 2, p.stdout[-3000:]
    assert "invalid sweep — nothing was started (4 jobs)" in p.stdout
    lines = [line.strip() for line in p.stdout.splitlines() if line.strip().startswith("#")]
    assert len(lines) == 3, p.stdout
    assert any("matrices=3 depth=4" in line and "M = 1 or M = 2" in line for line in lines)
    assert any("matrices=1 depth=0" in line and "depth (L) must be" in line for line in lines)
    assert "Traceback" not in p.stdout
    assert not (cli.cwd / "multirun").exists() and not (cli.cwd / "mlflow.db").exists()


def test_a_damaged_store_is_named_before_any_run(cli):
    """Row 8: a truncated ``mlflow.db`` gave a 78-line traceback that never named the file."""
    db = cli.cwd / "mlflow.db"
    tracking.check_store(cli.uri)  # a real store, with an experiment in it
    tracking.prepare_experiment(cli.uri, "rankexp")
    with sqlite3.connect(db) as c:  # everything into the main file, then cut it short
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.write_bytes(db.read_bytes()[:4096])
    p = cli("depth=3", "width=8", "seeds=1", check=False)
    assert p.returncode == 2, p.stdout[-2000:]
    assert f"{db} cannot be used as an MLflow store" in p.stdout
    assert "Traceback" not in p.stdout and len(p.stdout.strip().splitlines()) <= 3, p.stdout
    p = cli("depth=3", "width=8", "seeds=1", "alpha=1,2,3", "-m", check=False)  # once, not per job
    assert p.returncode == 2 and p.stdout.count(f"{db} cannot be used as an MLflow store") == 1, p.stdout
    assert not (cli.cwd / "multirun").exists()


# --------------------------------------------------------------------------- one error style
def _choices(group: str) -> list[str]:
    """A group's choices from the conf tree itself (not from Hydra's listing)."""
    from pathlib import Path

    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def _default(key: str):
    from rankexp.knobs import default

    return default(key)  # the knob table: the one place a default is written


def _typed_cases():
    from rankexp.probes import PROBES

    n = PROBES["representation"].options["n"]
    return [("alpha=abc", "alpha='abc'", f"allowed: a number, e.g. alpha={_default('alpha')}"),
            ("task.options.representation.n=abc", "task.options.representation.n='abc'",
             f"allowed: an integer, e.g. task.options.representation.n={n}")]


#: issue 19 row 3: each mistake, the key=value it names, the suggestion, what is allowed
CHOICE_MISTAKES = [
    ("norm=psot", "norm='psot'", "did you mean 'post'?", "allowed: " + ", ".join(_choices("norm"))),
    ("experiment=fig44", "experiment='fig44'", "did you mean 'fig4'?",
     "allowed: " + ", ".join(_choices("experiment"))),
    ("size=smok", "size='smok'", "did you mean 'smoke'?", "allowed: cpu, full, smoke"),
    ("task=trian", "task='trian'", "did you mean 'train'?", "allowed: " + ", ".join(_choices("task"))),
]


def _one_line(p) -> str:
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert p.returncode == 2, p.stdout[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: invalid config: "), p.stdout[-3000:]
    return lines[0]


def _nothing_created(cli) -> None:
    left = sorted(p.name for p in cli.cwd.iterdir())
    assert left == [], left  # no outputs/, no multirun/, no store


@pytest.mark.parametrize("override,named,hint,allowed", CHOICE_MISTAKES)
def test_a_mistyped_group_choice_is_one_line_with_a_suggestion(cli, override, named, hint, allowed):
    """Issue 19 row 3: Hydra's 15-line "Could not find 'norm/psot'" (the options one a line, the
    search path) is the key typo's one line: key, value, the closest choice, every choice."""
    line = _one_line(cli(override, check=False))
    assert line == f"error: invalid config: {named} — {hint} {allowed}", line
    _nothing_created(cli)


@pytest.mark.parametrize("case", range(2))
def test_a_value_of_the_wrong_type_is_one_line_with_an_example(cli, case):
    """Issue 19 row 3: OmegaConf's "Value 'abc' of type 'str' could not be converted to Float /
    full_key … object_type=…" is one line: key, value, the type allowed, the composed value as
    an example (the default from the knob table, the option's from the probe registry)."""
    override, named, allowed = _typed_cases()[case]
    line = _one_line(cli(override, check=False))
    assert line == f"error: invalid config: {named} — {allowed}", line
    _nothing_created(cli)


@pytest.mark.parametrize("sweep,job,message", [
    (("norm=pre,psot",), "norm=psot", "norm='psot' — did you mean 'post'? allowed: "
     + ", ".join(_choices("norm"))),
    (("alpha=1,abc",), "alpha=abc", "alpha='abc' — allowed: a number, e.g. alpha=1.0"),
])
def test_a_sweep_names_its_bad_job_in_the_same_words_and_starts_nothing(cli, sweep, job, message):
    p = cli(*sweep, "depth=2", "width=8", "-m", check=False)
    assert p.returncode == 2, p.stdout[-3000:]
    lines = [line.strip() for line in p.stdout.splitlines() if line.strip()]
    assert lines == ["error: invalid sweep — nothing was started (2 jobs):",
                     f"#1 {job}: invalid config: {message}"], p.stdout
    _nothing_created(cli)


def test_a_bad_choice_outside_any_swept_key_fails_the_sweep_in_one_line(cli):
    """``experiment=fig44 -m``: Hydra composes the sweep's own config first and fails there."""
    line = _one_line(cli("experiment=fig44", "-m", check=False))
    assert line.startswith("error: invalid config: experiment='fig44' — did you mean 'fig4'?")
    _nothing_created(cli)


def test_hydra_full_error_keeps_hydras_report(cli):
    """``HYDRA_FULL_ERROR=1`` is Hydra's documented switch for the whole stack trace."""
    p = cli("norm=psot", check=False, env={"HYDRA_FULL_ERROR": "1"})
    assert p.returncode == 2 and "Traceback" in p.stdout and "Could not find 'norm/psot'" in p.stdout
    assert "did you mean" not in p.stdout


def _composition_error(*overrides: str) -> BaseException:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        try:
            compose("config", list(overrides))
        except Exception as e:  # what Hydra raises is the subject
            return e
    raise AssertionError(f"{overrides} composed")


@pytest.mark.parametrize("overrides,line", [
    (["tracking.force=ture"], "invalid config: tracking.force='ture' — did you mean 'true'? "
                              "allowed: true, false"),
    (["activation=relo"], "invalid config: activation='relo' — did you mean 'relu'? allowed: "
                          "relu, gelu, silu, abs, tanh, linear, leaky_relu, swiglu"),
    (["norm.op=magic"], "invalid config: norm.op='magic' — allowed: rmsnorm, layernorm, "
                        "detached, meansub, batchnorm"),
    (["lr=nul"], "invalid config: lr='nul' — did you mean 'null'? allowed: a number or null"),
    (["seed=null"], "invalid config: seed=null — allowed: an integer, not null, e.g. seed=0"),
    (["seeds=1.5"], "invalid config: seeds=1.5 — allowed: an integer, e.g. seeds=4"),
    (["task=train", "task.lrs=[a]"], "invalid config: task.lrs[0]='a' — allowed in task.lrs: numbers"),
    (["task.probes=abc"], "invalid config: task.probes='abc' — allowed: a list in brackets, "
                          "task.probes=[a,b]"),
    (["hydra/launcher=lcoal"], "invalid config: hydra/launcher='lcoal' — did you mean 'local'? "
                               "allowed: basic, example_gpu_cluster, joblib, local, "
                               "slurm, slurm_gpu, submitit_local, submitit_slurm"),
    # a key of the group's other choice (the key check before Hydra knows every choice's keys)
    (["task.steps=5"], "invalid config: task.steps — task=measure has no key 'steps', task=train "
                       "has: add task=train"),
    (["model.base_width=4"], "invalid config: model.base_width — model=mlp has no key "
                             "'base_width', model=cifar_resnet has: add model=cifar_resnet"),
])
def test_one_line_reads_hydras_own_exception(overrides, line):
    """Every kind of node OmegaConf refuses a value for (bool, enum, optional float, int, list
    element, list) and a group choice Hydra cannot find, in-process: the allowed names are
    OmegaConf's (the enum's members) and Hydra's (the options it listed)."""
    from rankexp.cli import one_line

    assert one_line(_composition_error(*overrides)) == line


def test_one_line_leaves_other_errors_to_hydra():
    """Not a composition error → None (Hydra reports it); a valid override composes."""
    from rankexp.cli import one_line

    assert one_line(ValueError("boom")) is None and one_line(KeyError("norm")) is None
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        assert compose("config", ["tracking.force=true", "activation=gelu"]).tracking.force is True


@pytest.mark.parametrize("value", ["0", "many", "1.5"])
def test_a_thread_count_is_auto_or_a_whole_number(value):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"threads={value}"])
    with pytest.raises(ConfigError, match=f"threads={value!r}" if value == "many"
                       else f"threads={value}"):
        check_job(cfg)
