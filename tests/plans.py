"""Every experiment config composed and planned once per test session (composing is most of a
config test's time): ``plan(name, size)`` is the sweep ``rankexp experiment=<name>
size=<size> -m`` runs (composed, not run), ``composed(name, *overrides)`` the job config with
Hydra's (read-only: it is shared by every test that asks)."""

from __future__ import annotations

import functools
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rankexp_plugins.grids import Plan, sweep_plan
from rankexp.cli import CONF_DIR

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
#: the experiments whose plans compose every job (grids whose jobs may repeat a config: the
#: twins are left out by their hash), 5–15 s each at the larger sizes
PLANNED_BY_HASH = {"fig4", "fig15", "mf_bn", "mf_spectrum"}


@functools.cache
def plan(name: str, size: str) -> Plan:
    return sweep_plan(f"experiment={name}", f"size={size}")


@functools.cache
def composed(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", [f"experiment={name}", *overrides], return_hydra_config=True)
    OmegaConf.set_readonly(cfg, True)
    return cfg
