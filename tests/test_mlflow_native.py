"""Issue 19 item 3: runs that read as MLflow users expect — a run name, tags and a note
settable from the config (``tracking.run_name``, ``tracking.tags``, ``tracking.note``), and
the experiment's description (``tracking.description``, set by each experiment config) — each
checked in a real SQLite store written by the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import runs_in
from hydra import compose, initialize_config_dir
from plans import EXPERIMENTS, composed

from rankexp.app import STEP_AXIS
from rankexp.cli import CONF_DIR
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_ROOT

TINY = ("width=8", "depth=2", "seeds=1", "task.probes=[io_jacobian]")
NOTE = "Checking the **norm** placement."


def experiment(uri: str, name: str = "rankexp"):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_experiment_by_name(name)


def test_a_single_runs_name_tags_note_and_experiment_description_reach_the_store(cli):
    cli(*TINY, "tracking.run_name=baseline", "+tracking.tags.team=vision",
        "+tracking.tags.ticket=RX-12", f"tracking.note={NOTE}",
        "tracking.description=Pre- vs Post-Norm at small width")
    (run,) = runs_in(cli.uri)
    assert run.info.run_name == "baseline" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["team"], tags["ticket"]) == ("vision", "RX-12")
    assert tags["mlflow.note.content"] == f"{NOTE}\n\n{STEP_AXIS}"  # + what "Step" is
    exp = experiment(cli.uri)
    assert exp.tags["mlflow.note.content"] == "Pre- vs Post-Norm at small width"
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # not GenAI
    assert not any(k.startswith("tracking.") for k in run.data.params)  # not what a run computes


def test_without_the_knobs_a_run_keeps_its_config_name_and_notes_only_its_step_axis(cli):
    from mlflow.tracking import MlflowClient

    # an experiment an older rankexp made: its runs are described all the same
    MlflowClient(cli.uri).create_experiment(
        "rankexp", artifact_location=(cli.cwd / "mlartifacts" / "rankexp").as_uri())
    cli(*TINY)
    (run,) = runs_in(cli.uri)
    assert run.info.run_name.startswith("pre")
    assert run.data.tags["mlflow.note.content"] == STEP_AXIS
    assert "layer l" in STEP_AXIS and "**Step**" in STEP_AXIS
    assert "team" not in run.data.tags
    assert not any(k.startswith("system/") for k in run.data.metrics)  # a measurement: seconds
    assert "mlflow.note.content" not in experiment(cli.uri).tags


def test_in_a_sweep_the_knobs_name_the_parent_and_tag_and_note_every_run(cli):
    cli("alpha=1,2", *TINY, "tracking.run_name=alpha-scan", "+tracking.tags.team=vision",
        f"tracking.note={NOTE}", "tracking.description='the α scan'", "-m")
    runs = runs_in(cli.uri)
    (parent,) = [r for r in runs if r.data.tags.get("rankexp.role") == "sweep"]
    jobs = [r for r in runs if r is not parent]
    assert parent.info.run_name == "alpha-scan"
    assert sorted(r.info.run_name for r in jobs) == ["α1", "α2"]  # the swept axis names the jobs
    assert all(r.data.tags["team"] == "vision" for r in runs)
    assert all(r.data.tags["mlflow.note.content"] == f"{NOTE}\n\n{STEP_AXIS}" for r in jobs)
    parent_note = parent.data.tags["mlflow.note.content"]
    assert parent_note.startswith(NOTE + "\n\n") and "alpha=1,2" in parent_note  # + the command
    # the swept knobs and the headline metric
    assert "Swept: alpha; headline: erank_io, stable_rank_io" in parent_note, parent_note
    assert experiment(cli.uri).tags["mlflow.note.content"] == "the α scan"


@pytest.mark.parametrize(("override", "says"), [
    ("+tracking.tags.config_hash=x", "rankexp writes itself"),
    ("+tracking.tags.job_dir=x", "rankexp writes itself"),
    ("tracking.run_name=' '", "non-empty"),
])
def test_a_bad_knob_is_refused_before_any_run(cli, override, says):
    p = cli(*TINY, override, check=False)
    assert p.returncode == 2, p.stdout[-2000:]
    assert says in p.stdout and "Traceback" not in p.stdout
    assert not (cli.cwd / "mlflow.db").exists()


def test_tag_names_rankexp_writes_or_mlflow_refuses_are_not_the_users():
    from rankexp.tracking import user_tag_problem

    for ok in ("team", "ticket", "data-version", "a.b", "seed_std"):
        assert user_tag_problem(ok) is None, ok
    for reserved in ("config_hash", "sweep_id", "mlflow.user", "mlflow.note.content",
                     "rankexp.role", "seed_std.erank_io"):
        assert "rankexp writes itself" in user_tag_problem(reserved), reserved
    for illegal in ("", "a*b", "x" * 251, "a//b"):
        assert "MLflow accepts" in user_tag_problem(illegal), illegal


def test_the_knobs_leave_the_config_hash_alone():
    """``tracking`` is not part of what a run computes: setting every new knob keeps the hash
    (resume still finds the runs logged before the knobs existed)."""
    from rankexp.config import check_task

    def chash(*overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", ["width=8", "depth=2", *overrides], return_hydra_config=True)
        return check_task(cfg).config_hash

    plain = chash()
    assert chash("tracking.run_name=x", "+tracking.tags.team=v", "tracking.note=n",
                 "tracking.description=d") == plain
    assert chash("alpha=2") != plain  # (the hash does see what a run computes)


def test_every_experiment_config_describes_its_experiment():
    """Each experiment's description is data in its config (``tracking.description``), not a
    comment: the MLflow experiment shows it."""
    for name in EXPERIMENTS:
        text = composed(name).tracking.description
        assert text and len(text.split()) >= 8, name


@pytest.mark.skipif(not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}")
def test_a_training_run_has_cifar10_as_its_dataset_input_and_system_metrics(cli, tmp_path):
    """The run's Dataset column: ``CIFAR-10`` (context ``train``) whose digest is the decoded
    cache's SHA-256 — the checksum the cache is verified against — cut to MLflow's 36-character
    digest field, the whole SHA-256 and both splits' sizes in its profile.  And MLflow's system
    metrics (``system/…``, sampled here every 0.1 s through MLflow's own setting) beside the
    science's metrics."""
    import json

    import torch
    from mlflow.tracking import MlflowClient

    from rankexp.tasks.data import DEFAULT_CACHE_DIR

    cli("task=train", "width=8", "depth=2", "task.lrs=[0.001]", "task.steps=200",
        "task.eval_every=100", f"task.checkpoint_dir={tmp_path / 'ckpt'}",
        f"data.cache_dir={DEFAULT_CACHE_DIR}", env={"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.1"})
    (run,) = runs_in(cli.uri)
    system = {k for k in run.data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system
    assert "best_test_accuracy" in run.data.metrics
    (entry,) = MlflowClient(cli.uri).get_run(run.info.run_id).inputs.dataset_inputs
    cache = Path(json.loads(entry.dataset.source)["uri"])
    assert cache.parent == Path(DEFAULT_CACHE_DIR) and cache.name.startswith("cifar10-")
    sha = torch.load(cache, mmap=True, weights_only=True)["sha256"]
    assert len(sha) == 64
    assert entry.dataset.name == "CIFAR-10" and entry.dataset.digest == sha[:32]
    assert {t.key: t.value for t in entry.tags} == {"mlflow.data.context": "train"}
    profile = json.loads(entry.dataset.profile)
    assert profile["sha256"] == sha and (profile["train_rows"], profile["test_rows"]) == (50_000, 10_000)
