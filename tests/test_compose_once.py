"""Compose each job of a sweep once (issue 14, item 4): the sweeper's template loader builds
every job's config from one composition per set of group choices, and what it builds equals
Hydra's own composition of that job, node for node."""

from __future__ import annotations

import copy

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from rankexp.cli import CONF_DIR

SWEEPS = {
    "values": [[f"alpha={a}", "width=8", "depth=2"] for a in (1, 1.5, 2)],
    "groups and values": [[f"norm={n}", f"alpha={a}", "task.options.stream.inputs=4"]
                          for n in ("pre", "post") for a in (1, 2)],
    "experiment and size": [["experiment=fig5", "size=smoke", f"depth={d}", "++seed=3"]
                                   for d in (12, 24)],
    "train task": [["task=train", "task.steps=7", f"task.lrs=[{lr}]", "data.source=archive"]
                   for lr in (0.001, 0.01)],
}


def TemplateConfigLoader(inner):  # noqa: N802
    # imported once Hydra has scanned its plugins (the scan re-imports hydra_plugins modules)
    from hydra_plugins.rankexp_plugins.loader import TemplateConfigLoader as loader

    return loader(inner)


def resolved_task(cfg):
    """What the job sees (Hydra's run_job drops the hydra node), every interpolation resolved."""
    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    return OmegaConf.to_container(task, resolve=True)


@pytest.fixture(scope="module")
def hydra_loader():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


@pytest.mark.parametrize("name", list(SWEEPS))
def test_template_loader_builds_what_hydra_composes(hydra_loader, name):
    jobs = SWEEPS[name]
    master = hydra_loader.load_configuration("config", ["hydra/launcher=basic"], RunMode.MULTIRUN)
    fast = TemplateConfigLoader(hydra_loader)
    groups = {tuple(o for o in job if o.split("=")[0] in ("norm", "experiment", "size", "task"))
              for job in jobs}
    for job in jobs:
        mine = fast.load_sweep_config(master, job)
        hydras = hydra_loader.load_sweep_config(master, job)
        assert OmegaConf.to_container(mine) == OmegaConf.to_container(hydras), job
        assert resolved_task(mine) == resolved_task(hydras), job
        assert mine.hydra.overrides.task == hydras.hydra.overrides.task
        assert mine.hydra.job.override_dirname == hydras.hydra.job.override_dirname
    assert fast.compositions == len(groups)  # one per distinct set of group choices


def test_a_bad_value_fails_as_hydra_fails(hydra_loader):
    from hydra.errors import ConfigCompositionException

    master = hydra_loader.load_configuration("config", [], RunMode.MULTIRUN)
    fast = TemplateConfigLoader(hydra_loader)
    fast.load_sweep_config(master, ["depth=2"])
    with pytest.raises(ConfigCompositionException, match="depth=abc"):
        fast.load_sweep_config(master, ["depth=abc"])
    with pytest.raises(ConfigCompositionException):
        hydra_loader.load_sweep_config(master, ["depth=abc"])


def test_shipped_to_workers_without_its_templates(hydra_loader):
    import pickle

    master = hydra_loader.load_configuration("config", [], RunMode.MULTIRUN)
    fast = TemplateConfigLoader(hydra_loader)
    fast.load_sweep_config(master, ["depth=2"])
    clone = pickle.loads(pickle.dumps(fast))
    assert clone._templates == {} and fast._templates
    assert OmegaConf.to_container(clone.load_sweep_config(master, ["depth=3"])) == \
        OmegaConf.to_container(fast.load_sweep_config(master, ["depth=3"]))
