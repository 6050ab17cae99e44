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


# --------------------------------------------------------------------------- once per job (issue 18)
def test_no_config_of_the_tree_sets_hydra_mode(hydra_loader):
    """rankexp.cli.compose_once answers Hydra's get_mode without composing because no file of
    conf/ sets hydra.mode (nor names it in a defaults list); two experiments are composed as
    get_mode composes them to hold the composed config to it too."""
    import re
    from pathlib import Path

    import yaml

    files = sorted(Path(CONF_DIR).rglob("*.yaml"))
    assert len(files) > 40
    for f in files:
        text = f.read_text()
        doc = yaml.safe_load(text) or {}
        assert not re.search(r"hydra\.mode\s*[=:]", text), f  # read (${hydra.mode}), never set
        assert "mode" not in ((doc.get("hydra") or {}) if isinstance(doc, dict) else {}), f
    for overrides in (["experiment=fig5", "size=smoke"], ["experiment=degradation", "size=cpu"]):
        cfg = hydra_loader.load_configuration("config", overrides, RunMode.MULTIRUN)
        assert cfg.hydra.mode is None


COUNTER = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
import rankexp.config.checks as config
calls = {"compose": 0, "overrides": 0, "check": 0}
compose, apply, check = (ConfigLoaderImpl.load_configuration,
                         ConfigLoaderImpl._apply_overrides_to_config, config.check_job)
def counted_compose(self, *a, **k):
    calls["compose"] += 1
    return compose(self, *a, **k)
def counted_apply(*a, **k):
    calls["overrides"] += 1
    return apply(*a, **k)
def counted_check(*a, **k):
    calls["check"] += 1
    return check(*a, **k)
ConfigLoaderImpl.load_configuration = counted_compose
ConfigLoaderImpl._apply_overrides_to_config = staticmethod(counted_apply)
config.check_job = counted_check
from rankexp import cli
sys.argv = ["rankexp", *sys.argv[1:]]
try:
    cli.cli()
finally:
    print("COUNTS", calls)
"""


def _counts(tmp_path, *overrides):
    import ast
    import subprocess
    import sys

    from services import clean_env

    out = subprocess.run([sys.executable, "-c", COUNTER, "width=8", "depth=2", "seeds=1",
                          "tracking=off", "device=cpu", f"hydra.run.dir={tmp_path}/run",
                          f"hydra.sweep.dir={tmp_path}/sweep", *overrides],
                         cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("COUNTS"))
    return ast.literal_eval(line.split(" ", 1)[1])


def test_a_single_run_is_composed_once_and_checked_once(tmp_path):
    assert _counts(tmp_path) == {"compose": 1, "overrides": 1, "check": 1}


def test_each_job_of_a_sweep_is_composed_once_and_checked_once(tmp_path):
    """3 jobs: Hydra composes the master config and one template; each job is the template with
    its overrides applied once (for the whole-sweep check — the launch gets that config, where
    Hydra's basic launcher would build it again) and checked once (the job takes the check's
    result instead of checking again): 1 + 1 + 3 override applications, 3 checks (was 8, 6)."""
    counts = _counts(tmp_path, "alpha=1,2,3", "norm=pre", "-m")
    assert counts == {"compose": 2, "overrides": 5, "check": 3}


LIGHT = """
import sys
from hydra import compose, initialize_config_dir
from rankexp import cli, helptext
from rankexp.config import check_override_keys, check_task, config_groups
from rankexp.memory import seed_bytes
from rankexp.naming import config_name
check_override_keys(["depth=4", "norm=post"], config_groups(cli.CONF_DIR))
for overrides in (["experiment=fig5", "size=smoke"], ["model=gpt2", "width=64", "depth=2"],
                  ["model=cifar_resnet", "depth=8", "task.probes=[init_gradient_norms]"],
                  ["task=train", "data.download=true"]):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose("config", [*overrides, "device=auto"], return_hydra_config=True)
    checked = check_task(cfg)
    config_name(checked.settings)
    if checked.settings.task.name == "measure":
        seed_bytes(checked.settings)
helptext.probes()
# rankexp.tracking itself may load (the schema checks experiment and tag names with its rules):
# the package imports MLflow only inside the functions that talk to a store — mlflow and
# sqlalchemy stay in the list above
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "mlflow", "transformers",
               "torchvision", "sqlalchemy") or m.startswith(("rankexp.models.", "rankexp.probes.base",
               "rankexp.tasks", "rankexp.app"))
         and not m.startswith(("rankexp.models.spec", "rankexp.models.families")))
print("HEAVY", heavy)
"""


def test_composing_and_checking_a_config_imports_no_torch_mlflow_or_model():
    """The schema, the checks (keys, values, paths, device, memory estimate), run names and the
    probes' help read torch-free modules only: a sweep's check, `--help` and tab completion can
    run where torch is not imported (the job imports it once, when it builds its network)."""
    import subprocess
    import sys

    from services import clean_env

    out = subprocess.run([sys.executable, "-c", LIGHT], env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"
