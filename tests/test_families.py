"""A model family is one seam (rankexp/models/families/): what it declares — schema, builder,
tasks, derived params, run name, memory shape — and what its probes declare (families, tasks,
inputs) is what the config checks accept and refuse; nothing but the declarations and the one
checks module (rankexp/config/checks.py, every family rule) switches on ``model.name``."""

from __future__ import annotations

import copy
import importlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rankexp import cli
from rankexp.config import MODEL_SCHEMAS, ConfigError, validate
from rankexp.models.families import FAMILIES, family_of
from rankexp.probes import PROBES

REPO = Path(__file__).resolve().parent.parent
#: small shapes every family accepts (a ConvNet's depth is 6n+2)
SMALL = {"mlp": ["depth=8", "width=16"], "plain": ["depth=8", "width=16"],
         "gpt2": ["depth=2", "width=64"], "cifar_resnet": ["depth=8"]}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        return compose("config", list(overrides))


def _sources(*roots: str) -> list[Path]:
    return [p for r in roots for p in (REPO / r).rglob("*.py")
            if "families" not in p.relative_to(REPO).parts and p != REPO / "rankexp/config/checks.py"]


def test_no_model_name_switch_outside_the_family_declarations():
    """``model.name ==``/``in``/``!=`` and ``isinstance(…, <Family>Model)`` appear only in
    rankexp/models/families/ (the declarations) and rankexp/config/checks.py (their rules),
    nowhere else in rankexp/ or hydra_plugins/."""
    schemas = "|".join(t.__name__ for t in MODEL_SCHEMAS.values())
    switch = re.compile(rf"model\.name\s*(==|!=|\bin\b|\bnot in\b)|isinstance\([^)]*({schemas})\b"
                        r"|\.model,\s*\(?(" + schemas + ")")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _sources("rankexp", "hydra_plugins")
             for i, line in enumerate(p.read_text().splitlines(), 1) if switch.search(line)]
    assert not found, found
    # the pattern does find a switch (it failed on the v1 sources)
    assert switch.search('if s.model.name == "gpt2":') and switch.search(
        "isinstance(s.model, Gpt2Model)") and switch.search('s.model.name in ("mlp", "plain")')


def test_hidden_width_and_nominal_ratio_are_computed_once():
    """``round(m/d · d)`` and βα^M have one function each (rankexp/models/spec.py)."""
    hidden = re.compile(r"round\([^)]*expansion\s*\*|expansion\s*\*\s*[a-z_.]*width\)")
    ratio = re.compile(r"alpha\s*\*\*\s*\(?[a-z_.]*matrices|alpha\s*\*\*\s*\(1 if")
    spec = REPO / "rankexp" / "models" / "spec.py"
    for p in _sources("rankexp", "hydra_plugins"):
        if p == spec:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            assert not (hidden.search(line) or ratio.search(line)), f"{p}:{i}: {line.strip()}"
    from rankexp.models.spec import hidden_width, nominal_ratio

    assert hidden_width(256, 4.0, 2) == 1024 and hidden_width(256, 4.0, 1) == 256
    assert hidden_width(3, 0.5, 2) == 2 and hidden_width(1, 0.1, 2) == 1  # round half to even
    assert nominal_ratio(0.5, 2.0, 2) == 2.0 and nominal_ratio(0.5, 2.0, 1) == 1.0


def test_every_model_choice_is_a_declared_family():
    """conf/model/<name>.yaml ↔ FAMILIES; each declared builder resolves to a function."""
    assert sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml")) == sorted(FAMILIES)
    for name, fam in FAMILIES.items():
        cfg = _compose(f"model={name}", *SMALL[name])
        assert list(cfg.task.probes) == list(fam.default_probes or [
            "io_jacobian", "profile", "stream", "branch_ratio"])  # the family's measure default
        OmegaConf.update(cfg, "task.probes", [fam.probes[0]])
        s = validate(cfg)
        assert family_of(s) is fam and isinstance(s.model, fam.schema)
        module, _, attr = fam.builder.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))


def _accepts(composed, probe: str) -> bool:
    cfg = copy.deepcopy(composed)
    OmegaConf.update(cfg, "task.probes", [probe])
    try:
        validate(cfg)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_checks_accept_exactly_what_families_and_probes_declare(family):
    """For every (family, task, probe): the config is accepted iff the family accepts the task
    and the probe declares the family and the task — the declarations are the rule."""
    fam = FAMILIES[family]
    for task in ("measure", "train"):
        extra = ["lr=0.01"] if task == "train" else []
        composed = _compose(f"model={family}", f"task={task}", *SMALL[family], *extra)
        for name, probe in PROBES.items():
            declared = task in fam.tasks and family in probe.families and task in probe.tasks
            assert _accepts(composed, name) == declared, (family, task, name)
    assert fam.probes and all(family in PROBES[p].families for p in fam.probes)


def test_family_declarations_feed_run_names_params_and_memory():
    """The run name, the derived params (βα^M with M = 1 for a plain net) and the memory shape
    come from the family."""
    from rankexp.app import derived_params
    from rankexp.memory import model_shape
    from rankexp.naming import config_name
    from rankexp.probes.catalog import ConvShape, ModelShape

    mlp = validate(_compose("alpha=2", "beta=0.5", "depth=16", "width=8"))
    plain = validate(_compose("model=plain", "alpha=2", "beta=0.5", "depth=16", "width=8"))
    conv = validate(_compose("model=cifar_resnet", "depth=20", "task.probes=[layer_response]"))
    lm = validate(_compose("model=gpt2", "depth=2", "width=64"))
    assert derived_params(mlp)["nominal_ratio"] == 0.5 * 2**2
    assert derived_params(plain)["nominal_ratio"] == 0.5 * 2
    assert derived_params(mlp)["depth_factor"] == pytest.approx(2.0 * 4)
    assert derived_params(conv) == {} and derived_params(lm) == {}
    assert config_name(mlp) == "pre·α2·β0.5·L16·d8" and config_name(conv) == "resnet·L20·measure"
    assert config_name(lm) == "gpt2·L2·d64"
    assert isinstance(model_shape(conv), ConvShape) and model_shape(mlp, "cpu") == ModelShape(
        8, 16, 32, 2, 1, 8, False)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_that_claims_the_default_probes_runs_them(family, tmp_path):
    """``rankexp model=<family>`` as typed: a family that declares every default probe runs
    them all (a plain net has no residual stream, but its states are still the trajectory)."""
    import torch

    from rankexp.tasks import TASKS

    composed = _compose(f"model={family}", *SMALL[family])
    if not set(composed.task.probes) <= set(FAMILIES[family].probes):
        with pytest.raises(ConfigError, match="not probes of"):  # refused before any run
            validate(composed)
        return
    s = validate(composed)
    m = TASKS["measure"](s, torch.device("cpu"), tmp_path, None, "0" * 16)
    assert m.scalars and all(isinstance(v, float) for v in m.scalars.values())
