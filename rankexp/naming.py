"""Run names that show what a sweep varies: ``post·α2·L96``, ``detached·L48``, ``n=512``: one
label per swept axis in the sweep's order, after a ``model=``/``norm=``/``task=`` choice given
(``norm=post alpha=1,2 depth=48,96`` → ``post·α1·L48``).  A single run is named from its config
(:func:`config_name`), a sweep's parent by experiment and start time (:func:`sweep_name`)."""

from __future__ import annotations

import datetime
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

from .knobs import KNOBS
from .models.families import family_of

#: swept key → label prefix (the value follows; ``""``: the value alone)
PREFIX = {**{k.key: k.symbol for k in KNOBS if k.symbol is not None},
          "norm": "", "model": "", "task": ""}
#: values shown in the field's notation instead of the config's spelling
VALUE = {"beta_scaling": {"const": "β", "inv_sqrt_depth": "β/√L", "inv_depth": "β/L"}}
SEP = "·"


def _number(value: str) -> str:
    try:
        return f"{float(value):g}"
    except ValueError:
        return value


def label(key: str, value: str) -> str:
    """The short label of one swept axis at one value: ``alpha=2`` → ``α2``, ``norm.op=detached``
    → ``detached``, ``task.options.representation.n=512`` → ``n=512``."""
    key = key.lstrip("+~")
    value = str(value).strip("'\"")
    if key in VALUE:
        return VALUE[key].get(value, value)
    if key in PREFIX:
        prefix = PREFIX[key]
        return prefix + (_number(value) if prefix and not prefix.endswith(":") else value)
    return f"{key.rsplit('.', 1)[-1]}={_number(value)}"


def split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


#: group choices named even when the sweep does not vary them (``norm=post alpha=1,2`` → ``post·α1``)
NAMED_CHOICES = ("model", "norm", "task")


def job_name(overrides: Sequence[str], swept: Iterable[str]) -> str:
    """The name of one job of a sweep from its ``overrides`` (``["norm=post", "alpha=2"]``): the
    choices of :data:`NAMED_CHOICES` it was given, then a label per ``swept`` key, in order."""
    axes = list(dict.fromkeys(k.lstrip("+~") for k in swept))
    given = dict(split(o) for o in overrides)
    keys = [k for k in NAMED_CHOICES if k in given and k not in axes] + axes
    return SEP.join(label(k, given[k]) for k in keys if k in given)


def job_names(jobs: Sequence[Sequence[str]], swept: Iterable[str], fallback: Sequence[str]) -> list[str]:
    """Names of every job of a sweep, made distinct: a name shared by two jobs (``alpha=1`` and
    ``alpha=1.0``) gets ``#<job number>``; a job with no swept axis takes its ``fallback``."""
    swept = list(swept)
    names = [job_name(o, swept) or fallback[i] for i, o in enumerate(jobs)]
    seen = Counter(names)
    return [f"{n}{SEP}#{i}" if seen[n] > 1 else n for i, n in enumerate(names)]


def config_name(s) -> str:
    """A single run's name from its typed config, as its model family declares it:
    ``post·α1·β1·L48·d256``, ``gpt2·L12·d768``, ``resnet·L110·train``."""
    return family_of(s).run_name(s)


def sweep_name(experiment: str | None, size: str, started: datetime.datetime | None = None) -> str:
    """The parent run's name: ``fig1·smoke·2026-12-01 12:40:03`` (size left out when full)."""
    started = started or datetime.datetime.now()
    parts = [experiment or "sweep"] + ([size] if size and size != "full" else [])
    return SEP.join(parts) + f"·{started:%Y-%m-%d %H:%M:%S}"


def member_name(run_name: str, lr: float) -> str:
    """A learning-rate member's run name: ``post·α1·L48·train·lr1e-3``; the rate ``lr2.5e-4``
    below 0.01 (≤ 3 significant digits), ``lr0.01``, ``lr1`` from there up."""
    if lr == 0 or abs(lr) >= 0.01:
        return f"{run_name}{SEP}lr{lr:g}"
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{run_name}{SEP}lr{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def experiment_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an experiment (a path component of at most 255 bytes without
    control characters: an SQLite store keeps its artifacts in ``mlartifacts/<name>``), or
    ``None``."""
    if not name or not name.strip():
        return "must be a non-empty name"
    if name != name.strip():
        return "must not begin or end with a blank"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "is a name, not a path: no '/' or '\\', not '.' or '..' (e.g. fig6-ablation)"
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        return "must not contain control characters"
    if len(name.encode()) > 255:  # MLflow's own limit (500 characters) lets these through
        return (f"is {len(name.encode())} bytes long: at most 255 (a file name: the folder of "
                "its artifacts; a SQL store's column holds 256 characters)")
    return None
