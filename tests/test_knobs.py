"""The knob table (rankexp/knobs.py) is the one place a knob's default, symbol, TeX label and
help live: the schema, the composed YAML, ``--help``, run names and figure labels read it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rankexp import cli, helptext, naming
from rankexp.config import RankexpConfig, TrainTask
from rankexp.knobs import BY_KEY, KNOBS, PRESET, default, for_task

CONF = Path(cli.CONF_DIR)


def _composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose("config", list(overrides))
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def _at(container: dict, key: str):
    for part in key.split("."):
        container = container[part]
    return container


@pytest.mark.parametrize("task", ["measure", "train"])
def test_the_composed_default_config_holds_each_knobs_table_default(task):
    """Every knob of the task composes to its row's default (the schema's field default reads
    the table; no YAML repeats it) — a default changed in the table changes the config."""
    c = _composed(f"task={task}")
    for k in KNOBS:
        if k.task not in (None, task) or k.default == PRESET or k.key == "task.probes":
            continue
        assert _at(c, k.key) == k.default, k.key


def test_no_yaml_restates_a_knob_default():
    """The knobs' defaults are written once: conf/config.yaml, conf/task/*.yaml and
    conf/tracking/default.yaml set no knob, except by an interpolation (task.probes: the
    model family's default); an experiment or size file sets a knob to a value of its own."""
    files = {CONF / "config.yaml": "", CONF / "tracking" / "default.yaml": "tracking."}
    files.update({f: "task." for f in (CONF / "task").glob("*.yaml")})
    for f, prefix in files.items():
        doc = yaml.safe_load(f.read_text()) or {}
        given = {prefix + k for k, v in doc.items() if k not in ("defaults", "hydra")
                 and not str(v).startswith("${")}  # an interpolation derives, not restates
        assert not given & set(BY_KEY), (f, sorted(given & set(BY_KEY)))


def test_every_train_field_and_top_level_knob_has_a_row():
    """``--help`` lists every training knob and top-level knob: each field of the schema a user
    sets is a row (the sub-configs and choices are listed by the groups)."""
    nodes = {"model", "norm", "task", "data", "tracking", "size"}
    top = {f.name for f in dataclasses.fields(RankexpConfig)} - nodes
    train = {f"task.{f.name}" for f in dataclasses.fields(TrainTask)} - {"task.name", "task.options"}
    assert top <= set(BY_KEY) and train - {"task.probes"} <= {k.key for k in for_task("train")}
    assert default("task.lrs") is not default("task.lrs")  # a fresh list each time


def test_run_name_prefixes_and_figure_labels_come_from_the_table():
    """naming's prefixes and the figures' axis labels are the rows' symbol and tex."""
    from analysis.core.style import SYMBOLS, name, value_label

    for k in KNOBS:
        if k.symbol is not None:
            assert naming.PREFIX[k.key] == k.symbol
        if k.tex is not None:
            assert SYMBOLS[k.key] == k.tex == name(k.key)
    assert naming.label("alpha", "2") == "α2" and naming.label("depth", "96") == "L96"
    assert name("depth") == "$L$" and value_label("expansion", 4) == "$m/d = 4$"
    assert naming.label("task.steps", "300") == "steps=300"  # no symbol: key=value


def _help(*overrides: str) -> str:
    out = subprocess.run([sys.executable, "-m", "rankexp", *overrides, "--help"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_help_of_both_tasks_lists_every_knob_in_the_table_as_plain_text():
    """`rankexp --help` and `rankexp task=train --help` list every knob of the table — the
    training knobs too — each with its help; `dtype` is described for both tasks; no Sphinx
    markup (roles, double backticks) reaches the terminal; no line is wider than 100."""
    for overrides, steps in (((), 5000), (("task=train", "task.steps=7"), 7)):
        out = _help(*overrides)
        flat = " ".join(out.split())
        for k in KNOBS:
            assert re.search(rf"^  {re.escape(k.key)}=", out, re.M), (overrides, k.key)
            assert " ".join(k.help.split()) in flat, (overrides, k.key)
        assert f"task.steps={steps} " in out and "task.lrs=[3e-05," in out
        assert "task=measure's precision" in out and "training precision" in out
        assert not re.search(r":[a-z]+:`|``", out), re.findall(r".*(?::[a-z]+:`|``).*", out)
        assert max(len(line) for line in out.splitlines()) <= 100


def test_plain_text_drops_sphinx_roles():
    assert helptext.plain_text("see :class:`~rankexp.models.mlp.ResidualMLP` and "
                               ":func:`rankexp.probes.x` on ``h_0``") == \
        "see ResidualMLP and rankexp.probes.x on h_0"
