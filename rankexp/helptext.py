"""``rankexp --help``: the sections of conf/hydra/help/rankexp.yaml built from their source of
truth through the resolver ``rankexp_help``: knobs (:data:`rankexp.knobs.KNOBS`), probes
(:data:`rankexp.probes.PROBES`), config groups (the folders of ``conf/``)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .knobs import KNOBS, for_task
from .locations import CONF_DIR
from .probes import DEFAULT_PROBES, PROBES

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
#: the choices of groups that are not a conf/ folder of their own (size: in the order they grow)
FIXED_CHOICES = {"hydra/launcher": ["basic", "local", "slurm", "slurm_gpu"],
                 "hydra/sweeper": ["rankexp", "basic"], "size": ["smoke", "cpu", "full"]}


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


def groups() -> str:
    """One line per config group: its choices and what it picks."""
    lines = []
    for g, what in GROUPS.items():
        choices = FIXED_CHOICES.get(g) or sorted(p.stem for p in (Path(CONF_DIR) / g).glob("*.yaml"))
        lines += textwrap.wrap(f"{g}: {', '.join(choices)}", 94, initial_indent="  ",
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
    """Resolver ``rankexp_help:<name>``: a help section (``knobs``: every task's knob as
    composed, ``train_knobs``: task=train's, ``groups``, ``probes``), ``$`` escaped."""
    if name == "knobs":
        text = "\n".join(_knob_lines(_root_, [k for k in KNOBS if k.task != "train"]))
    elif name == "train_knobs":
        text = "\n".join(_knob_lines(_root_, for_task("train")))
    else:
        text = {"groups": groups, "probes": probes}[name]()
    return text.replace("$", "$$")

