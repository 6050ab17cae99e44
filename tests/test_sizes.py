"""``size=smoke|cpu|full``: ``full`` is the experiment file itself (its size overlays are Hydra
``optional``: no empty overlay files), ``smoke`` and ``cpu`` only shrink — the sweep (every grid)
and the network — and every sweep lives in the config, none in a comment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hydra_plugins.rankexp_plugins.grids import sweep_plan
from rankexp.__main__ import CONF_DIR

CONF = Path(CONF_DIR)
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SIZES = ("smoke", "cpu", "full")


def compose_experiment(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", [f"experiment={name}", *overrides], return_hydra_config=True)


def network_width(cfg, plan) -> int:
    """The widest layer the sweep builds: ``width`` (the MLP's d), or a ConvNet's stage-1
    filters ``model.base_width`` (the top-level width is not its knob), over every job."""
    key = "model.base_width" if "base_width" in cfg.model else "width"
    default = cfg.model.base_width if key == "model.base_width" else cfg.width
    given = [int(o.split("=", 1)[1]) for job in plan.jobs for o in job if o.startswith(f"{key}=")]
    return max(given or [int(default)])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_has_three_sizes_that_shrink(name):
    cfgs = {size: compose_experiment(name, f"size={size}") for size in SIZES}
    assert [cfgs[s].size.value for s in SIZES] == list(SIZES)
    # the full size is the experiment file itself: no overlay, same sweep as no size given
    assert not (CONF / "size" / name / "full.yaml").exists()
    sweeper = {s: OmegaConf.to_container(cfgs[s].hydra.sweeper) for s in SIZES}
    assert sweeper["full"] == OmegaConf.to_container(compose_experiment(name).hydra.sweeper)
    # smaller sizes never grow the sweep or the network (a cpu size that measures at
    # initialization what the full size trains may hold more, cheaper, runs: degradation)
    plans = {s: sweep_plan(f"experiment={name}", f"size={s}") for s in SIZES}
    runs = [len(plans[s].jobs) for s in SIZES]
    cheaper = cfgs["cpu"].task.name == "measure" and cfgs["full"].task.name == "train"
    assert 1 <= runs[0] <= min(runs[1:]) and (runs[1] <= runs[2] or cheaper), runs
    widths = [network_width(cfgs[s], plans[s]) for s in SIZES]
    assert widths == sorted(widths) and widths[0] <= 32, widths


def test_size_overlays_belong_to_experiments_and_say_something():
    for path in (CONF / "size").glob("*/*.yaml"):
        assert path.parent.name in EXPERIMENTS, path
        assert path.stem in ("smoke", "cpu"), path
        body = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert body, f"{path} is empty: leave it out (the size is then the experiment file)"


def test_no_sweep_lives_in_a_comment():
    for path in CONF.rglob("*.yaml"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.match(r"\s*#\s*also\b", line), f"{path}:{n}: {line}"


def test_command_line_beats_the_size():
    cfg = compose_experiment("fig5", "size=cpu", "width=7")
    assert cfg.width == 7 and cfg.seeds == 2
    assert cfg.hydra.sweeper.params.depth == "12,24,48,96,192"


def test_an_overlay_shrinks_one_grid_of_several():
    full, smoke = (sweep_plan("experiment=fig4", f"size={s}") for s in ("full", "smoke"))
    assert {g: full.grid.count(g) for g in full.axes} == {"placements": 48, "control": 29}
    assert {g: smoke.grid.count(g) for g in smoke.axes} == {"placements": 8, "control": 9}


def test_size_is_not_part_of_the_config_hash():
    from rankexp.config import config_hash, resolved_container

    def container(*overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return resolved_container(compose("config", ["experiment=demo", *overrides]))

    a, b = container("size=full", "width=64", "seeds=2"), container("size=cpu")
    assert a["size"] != b["size"] and config_hash(a) == config_hash(b)
