"""What a Hydra + MLflow user expects (issue 9): run names that differ where configs do, the
``rankexp`` command with its help and shell completion, probe options overridable as typed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from plans import EXPERIMENTS, PLANNED_BY_HASH, plan

from rankexp import naming
from rankexp.cli import CONF_DIR
from rankexp.config import ConfigError, check_override_keys, config_groups, config_hash
from rankexp.probes import PROBES

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(("experiment", "size"), [  # the full plans that compose every job: slow
    pytest.param(e, s, marks=[pytest.mark.slow] * (s == "full" and e in PLANNED_BY_HASH))
    for e in EXPERIMENTS for s in ("smoke", "full")])
def test_every_experiments_sweep_has_distinct_run_names(experiment, size):
    """Row 1: for every experiment's sweep (every grid of its config), at size=smoke and full,
    the names built from the swept axes (led by the grid's name where there are several) are
    pairwise distinct — without the ``#n`` fallback — and short."""
    planned = plan(experiment, size)
    names = planned.names(["base"] * len(planned.jobs))
    assert len(set(names)) == len(names), (experiment, size, names)
    assert not any("#" in n for n in names) and max(map(len, names)) <= 60, names
    if len(planned.jobs) > 1:
        assert all(names) and "base" not in names, names


def test_names_show_the_axes_in_the_fields_notation():
    jobs = [["norm=post", "alpha=2", "depth=96"], ["norm=post", "alpha=1.0", "depth=96"]]
    assert naming.job_names(jobs, ["alpha", "depth"], ["", ""]) == ["post·α2·L96", "post·α1·L96"]
    assert naming.job_name(["norm.op=detached"], ["norm.op"]) == "detached"
    assert naming.job_name(["beta_scaling=inv_sqrt_depth", "task.options.representation.n=512"],
                           ["beta_scaling", "task.options.representation.n"]) == "β/√L·n=512"
    # values that read the same are told apart by the job number, never merged
    assert naming.job_names([["alpha=1"], ["alpha=1.0"]], ["alpha"], ["", ""]) == ["α1·#0", "α1·#1"]
    assert naming.sweep_name("fig1", "smoke").startswith("fig1·smoke·20")


def test_probe_options_override_as_typed_and_unknown_keys_are_refused():
    """Row 5: the schema of task.options is the probes' declared options; no `+` needed."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", ["task.options.representation.n=512", "task.options.correlation.c0=0"])
        plain = compose("config")
    assert cfg.task.options.representation.n == 512 and cfg.task.options.correlation.c0 == 0.0
    for name, probe in PROBES.items():
        assert OmegaConf.to_container(plain.task.options[name]) == dict(probe.options), name
    groups = config_groups(CONF_DIR)
    check_override_keys(["task.options.stream.inputs=4"], groups)
    with pytest.raises(ConfigError, match=r"unknown key 'task.options.representation.m'.* n$"):
        check_override_keys(["task.options.representation.m=4"], groups)
    with pytest.raises(ConfigError, match="did you mean 'task.options.representation'"):
        check_override_keys(["task.options.represent.n=4"], groups)
    # options at their defaults leave the config hash as v1's `options: {}` had it
    container = OmegaConf.to_container(plain, resolve=True, enum_to_str=True)
    v1 = {**container, "task": {**container["task"], "options": {}}}
    assert config_hash(container) == config_hash(v1)
    chosen = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert config_hash(chosen) != config_hash(container)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    return env


def test_rankexp_help_lists_knobs_probes_and_groups_users_choose(tmp_path):
    """Row 4: the console script's app help, in a subprocess."""
    p = subprocess.run(["rankexp", "depth=96", "--help"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "depth=96" in out and "L, number of blocks" in out and "width=256" in out
    assert "beta_scaling=const" in out and "BetaScaling" not in out
    for probe, opts in PROBES.items():
        assert probe in out
        for key in opts.options:
            assert f"{key}=" in out, (probe, key)
    assert "norm: none, output, peri, post, pre" in out and "size: smoke, cpu, full" in out
    assert "schema/" not in out and "fig1/" not in out and "powered by Hydra" not in out


def test_bash_completion_of_the_rankexp_command(tmp_path):
    """Row 3: install Hydra's bash completion for `rankexp` and complete `nor<TAB>` exactly as
    bash would (the completion function with COMP_LINE/COMP_POINT/COMP_CWORD).  The install
    runs the form `--hydra-help` prints for `python -m rankexp` (`python …/rankexp/__main__.py`),
    which v1's relative import crashed."""
    script = f"""
set -e
eval "$({sys.executable} {Path(CONF_DIR).parent / 'rankexp' / '__main__.py'} -sc install=bash)"
eval "$(rankexp -sc install=bash)"
complete -p rankexp
COMP_LINE="rankexp alpha=2 nor"; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=(rankexp alpha=2 nor); COMP_CWORD=2
hydra_bash_completion
printf 'reply:%s\\n' "${{COMPREPLY[@]}}"
"""
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "hydra_bash_completion" in p.stdout and "rankexp" in p.stdout
    replies = {line[len("reply:"):] for line in p.stdout.splitlines() if line.startswith("reply:")}
    assert {"norm=", "norm."} <= replies, p.stdout


def test_heatmap_refuses_to_average_runs_whose_params_differ():
    """Row 9: a sweep plus one extra run with another width (and other probes) in one cell."""
    import pandas as pd

    from analysis.study.fig2 import heatmap_table

    grid = [(a, L) for a in (1.0, 2.0) for L in (4, 8)]
    rows = [{"alpha": a, "depth": L, "width": 16, "task.probes": "[io_jacobian]", "seed": 0,
             "nominal_ratio": a * a, "norm.placement": "post", "erank_io": 0.5} for a, L in grid]
    df = pd.DataFrame(rows)
    df.attrs["params"] = ["alpha", "depth", "width", "task.probes", "seed", "nominal_ratio",
                          "norm.placement"]
    assert heatmap_table(df, "erank_io", "alpha", "depth", "norm.placement")["count"].max() == 1
    again = pd.concat([df, df.assign(seed=4)])  # the same configs, other seeds: averaged
    assert heatmap_table(again, "erank_io", "alpha", "depth", None)["count"].max() == 2
    extra = pd.concat([df, df.iloc[:1].assign(width=32, **{"task.probes": "[profile]"})])
    from analysis.core.select import SelectionError

    with pytest.raises(SelectionError, match=r"width ∈ \[16, 32\]; task.probes ∈") as e:
        heatmap_table(extra, "erank_io", "alpha", "depth", "norm.placement")
    assert "--filter" in str(e.value)
    # … unless the differing param is an axis of the figure
    assert heatmap_table(extra, "erank_io", "alpha", "width", "depth")["count"].max() == 1


def test_the_gpu_cluster_launcher_example_composes_as_documented():
    """Row 11: launchers/README.md's worked example inherits slurm_gpu and sets site keys."""
    from rankexp.config import check_slurm_limits

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", ["hydra/launcher=example_gpu_cluster"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.partition == "gpu"
    assert cfg.hydra.callbacks.slurm_check._target_ == "rankexp.sweepctl.SlurmCheck"
    assert (launcher.account, launcher.qos, launcher.gres) == ("myproject", "normal", "gpu:a100:1")
    assert launcher.max_num_timeout == 10 and launcher.signal_delay_s == 120
    assert launcher.setup[0] == "module purge"
    check_slurm_limits(launcher)
