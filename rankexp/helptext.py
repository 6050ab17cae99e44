"""``rankexp --help``: the sections of the app help built from the code (conf/hydra/help/rankexp.yaml).

The help template is YAML; what would go stale there comes from its source of truth through the
resolver ``rankexp_help``: the knobs (every task's and task=train's) from the knob table
:data:`rankexp.knobs.KNOBS`, the probes, their needs and options from
:data:`rankexp.probes.PROBES`, the config groups a user chooses from the folders of ``conf/``
(not the schema nodes of the ConfigStore, not the per-experiment ``size/<experiment>/`` files).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .knobs import KNOBS, for_task
from .probes import DEFAULT_PROBES, PROBES

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

#: config groups a user picks, in the order the help lists them, with what they choose
GROUPS = {
    "experiment": "a figure's sweep (run with -m); header comment = what it shows",
    "size": "an experiment's size: smoke (seconds), cpu (every figure on 2 cores), full (the study's)",
    "model": "the network family",
    "norm": "where the norm sits (P, B, R of Eq. 17); norm.op=rmsnorm|layernorm|detached|meansub",
    "task": "what a job does",
    "tracking": "where runs are logged (MLflow)",
    "data": "the training data",
    "hydra/launcher": "how jobs run: in this process (basic), joblib (local), Slurm",
    "hydra/sweeper": "rankexp (whole-sweep check, parent run) or Hydra's basic",
}
HYDRA_CHOICES = {"hydra/launcher": ["basic", "local", "slurm", "slurm_gpu"],
                 "hydra/sweeper": ["rankexp", "basic"]}


#: size choices in the order they grow
SIZES = ["smoke", "cpu", "full"]


def _choices(group: str) -> list[str]:
    if group in HYDRA_CHOICES:
        return HYDRA_CHOICES[group]
    if group == "size":
        return SIZES
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _knob_lines(root, rows) -> list[str]:
    from omegaconf import OmegaConf

    width = max(len(k.key) for k in KNOBS) + 12
    lines = []
    for knob in rows:
        v = OmegaConf.select(root, knob.key, default=_ABSENT, throw_on_resolution_failure=False)
        if v is _ABSENT:  # another task's knob (task=measure's help lists task=train's)
            v = knob.default
        v = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
        shown = f"{knob.key}={_value(getattr(v, 'value', v))}"
        meaning = textwrap.wrap(knob.help, 96 - width) or [""]
        first = [f"  {shown:<{width}} {meaning[0]}"] if len(shown) < width \
            else [f"  {shown}", f"  {'':<{width}} {meaning[0]}"]
        lines += first + [f"  {'':<{width}} {m}" for m in meaning[1:]]
    return lines


_ABSENT = object()


def knobs(root) -> str:
    """One line per knob every task reads (:data:`rankexp.knobs.KNOBS`): ``key=value`` as
    composed (the default unless overridden) and its meaning."""
    return "\n".join(_knob_lines(root, [k for k in KNOBS if k.task != "train"]))


def train_knobs(root) -> str:
    """One line per ``task=train`` knob: as composed under ``task=train``, else its default."""
    return "\n".join(_knob_lines(root, for_task("train")))


def groups() -> str:
    """One line per config group: its choices and what it picks."""
    lines = []
    for g, what in GROUPS.items():
        lines += textwrap.wrap(f"{g}: {', '.join(_choices(g))}", 94, initial_indent="  ",
                               subsequent_indent="      ")
        lines.append(f"      {what}")
    return "\n".join(lines)


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return "null" if v is None else str(v).replace(" ", "").replace("'", "")


def probes() -> str:
    """One entry per probe: its name (★ = default), summary, what it computes, its options."""
    lines = []
    for name, p in PROBES.items():
        doc = plain_text(p.doc)  # read from the source: --help imports no probe code
        star = "*" if name in DEFAULT_PROBES else " "
        lines.append(f" {star}{name}")
        lines += textwrap.wrap(doc, 92, initial_indent="      ", subsequent_indent="      ")
        extra = []
        if p.needs:
            extra.append("needs " + ", ".join(sorted(p.needs)))
        if p.options:
            extra.append("options " + " ".join(f"{k}={_value(v)}" for k, v in p.options.items()))
        if extra:
            lines += textwrap.wrap("; ".join(extra), 92, initial_indent="      ",
                                   subsequent_indent="        ")
    return "\n".join(lines)


_ROLE = re.compile(r":[a-z]+:`~?([^`]*)`")


def plain_text(doc: str) -> str:
    """A docstring as terminal text: Sphinx roles (``:class:`~a.b.C``` → ``C``) and literal
    quotes (double backticks) dropped."""
    doc = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), doc)
    return doc.replace("``", "")


def section(name: str, *, _root_) -> str:
    """Resolver ``rankexp_help:<name>``: the text of a help section (``knobs``,
    ``train_knobs``, ``groups``, ``probes``), ``$`` escaped for the template Hydra fills in."""
    if name in ("knobs", "train_knobs"):
        text = {"knobs": knobs, "train_knobs": train_knobs}[name](_root_)
    else:
        text = {"groups": groups, "probes": probes}[name]()
    return text.replace("$", "$$")
