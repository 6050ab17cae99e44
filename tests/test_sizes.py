"""``size=smoke|cpu|full``: every experiment has its three sizes, and a size changes only the grid."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rankexp.__main__ import CONF_DIR

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
SIZES = ("smoke", "cpu", "full")


def compose_experiment(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", [f"experiment={name}", *overrides], return_hydra_config=True)


def grid_size(cfg) -> int:
    n = 1
    for v in (cfg.hydra.sweeper.params or {}).values():
        n *= len(str(v).split(","))
    return n


def network_width(cfg) -> int:
    """The widest layer the sweep builds: ``width`` (the MLP's d), or a ConvNet's stage-1
    filters ``model.base_width`` (the top-level width is not its knob)."""
    params = cfg.hydra.sweeper.params
    if "base_width" in cfg.model:
        return max(int(w) for w in str(params.get("model.base_width", cfg.model.base_width)).split(","))
    return max(int(w) for w in str(params.get("width", cfg.width)).split(","))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_has_three_sizes_that_shrink(name):
    for size in SIZES:
        assert (Path(CONF_DIR) / "size" / name / f"{size}.yaml").is_file(), (name, size)
    cfgs = {size: compose_experiment(name, f"size={size}") for size in SIZES}
    assert [cfgs[s].size.value for s in SIZES] == list(SIZES)
    # the full size is the experiment file itself
    assert OmegaConf.to_container(cfgs["full"].hydra.sweeper.params) == OmegaConf.to_container(
        compose_experiment(name).hydra.sweeper.params)
    # smaller sizes never grow the grid or the network
    assert grid_size(cfgs["smoke"]) <= grid_size(cfgs["cpu"]) <= grid_size(cfgs["full"])
    widths = [network_width(cfgs[s]) for s in SIZES]
    assert widths == sorted(widths) and widths[0] <= 32, widths


def test_command_line_beats_the_size():
    cfg = compose_experiment("fig5", "size=cpu", "width=7")
    assert cfg.width == 7 and cfg.seeds == 2
    assert cfg.hydra.sweeper.params.depth == "12,24,48,96,192"


def test_size_is_not_part_of_the_config_hash():
    from rankexp.config import config_hash, resolved_container

    def container(*overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return resolved_container(compose("config", ["experiment=demo", *overrides]))

    a, b = container("size=full", "width=64", "seeds=2"), container("size=cpu")
    assert a["size"] != b["size"] and config_hash(a) == config_hash(b)
