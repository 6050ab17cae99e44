"""The model families (``model=``), each declared once, torch-free (:class:`Family`).

Adding a family: its network and builder (``rankexp/models/<name>.py``), its declaration here
(``families/<name>.py``: schema, builder, run name, derived params, memory shape, tasks,
rules), one entry in :data:`FAMILIES`, and ``conf/model/<name>.yaml``; its probes declare it
(:attr:`rankexp.probes.catalog.Probe.families`).  :func:`check_family` is the one check of a
config against its family; nothing else switches on ``model.name``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import bad
from . import convnet, gpt2, mlp, plain
from .base import CIFAR10, GAUSSIAN, Family, branch_params, mlp_shape

if TYPE_CHECKING:
    from ...config import RankexpConfig

#: ``model.name`` → its family, in the order ``--help`` and errors list them
FAMILIES: dict[str, Family] = {f.name: f for f in (mlp.FAMILY, plain.FAMILY, gpt2.FAMILY,
                                                   convnet.FAMILY)}

__all__ = ["CIFAR10", "FAMILIES", "GAUSSIAN", "Family", "branch_params", "check_family",
           "family_of", "mlp_shape"]


def family_of(s: RankexpConfig) -> Family:
    """The family of a typed config (``s.model.name``)."""
    return FAMILIES[s.model.name]


_VERB = {"train": "train", "measure": "measure"}


def check_family(s: RankexpConfig) -> None:
    """A config against what its family and its probes declare: the task is one the family
    accepts; each probe accepts the task (``lesion``: a trained network) and the family; the
    family's own rules; no setting only another family has (σ_b, orthogonal init, batchnorm:
    ``model=plain``'s).  A training run's probes of the trained network measure one network
    (one rate); those of the initial network (:data:`~rankexp.probes.INIT_PROBES`) see the one
    network every rate starts from.

    Raises:
        ConfigError: the first rule broken, naming key, value and what is allowed.
    """
    from ...probes import INIT_PROBES, PROBES

    fam, task, probes = family_of(s), s.task.name, list(s.task.probes)
    trained = [p for p in probes if p not in INIT_PROBES]
    for p in probes:
        if task not in PROBES[p].tasks:
            raise bad("task.probes", p, "measures a trained network: use it with task=train"
                      if PROBES[p].tasks == frozenset({"train"}) else
                      f"runs with task={'|'.join(sorted(PROBES[p].tasks))}")
    if task == "train" and trained and s.lr is None and len(s.task.lrs) > 1:
        raise bad("task.probes", trained, "measure one trained network: give one "
                  f"learning rate (lr=… or task.lrs=[…]), not the sweep {list(s.task.lrs)}")
    if task not in fam.tasks:
        raise bad("task", task, f"model={fam.name} runs {', '.join('task=' + t for t in fam.tasks)} "
                  f"only; it does not {_VERB.get(task, 'run task=' + task)}")
    foreign = [p for p in probes if fam.name not in PROBES[p].families]
    if foreign:
        needs = sorted({f for p in foreign for f in PROBES[p].families})
        own = [p for p in fam.probes if task in PROBES[p].tasks]
        raise bad("task.probes", foreign, f"not probes of model={fam.name}: they need "
                  f"model={'|'.join(needs)}; model={fam.name} runs {', '.join(fam.probes)} "
                  f"(task={task}: task.probes=[{','.join(own)}])")
    if fam.check is not None:
        fam.check(s, probes)
    for other in FAMILIES.values():
        if other is not fam:
            for key, value, rule in other.exclusive(s):
                raise bad(key, value, rule)
