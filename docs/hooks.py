"""mkdocs hook: the tables of the site, generated from the registries, never retyped.

A page asks for a table with a marker line of its own:

* ``<!-- table: knobs -->`` / ``<!-- table: knobs train -->`` — :data:`rankexp.knobs.KNOBS`
  (the training knobs apart);
* ``<!-- table: groups -->`` — the config groups and their choices, read from ``conf/``;
* ``<!-- table: probes -->`` — :data:`rankexp.probes.PROBES`;
* ``<!-- table: experiments -->`` — ``analysis.core.registry.default()`` and the runs each
  experiment's sweep plans at every size.

An unknown marker fails the build.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's code, whatever is installed
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- table: (\w+)(?: (\w+))? -->$", re.M)
SIZES = ("smoke", "cpu", "full")


def _cell(text: object) -> str:
    """Text for a table cell: one line, pipes escaped, reST roles (``:class:`X```) dropped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", str(text))
    return " ".join(text.split()).replace("|", r"\|")


def _value(value: object) -> str:
    """A default as typed on a command line."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple)):
        return "`[" + ",".join(str(v) for v in value) + "]`"
    return f"`{value}`"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def knob_table(task: str | None = None) -> str:
    """The knobs a user sets (``task="train"``: the training knobs only, else all the others)."""
    from rankexp import knobs

    preset = getattr(knobs, "PRESET", "preset")
    rows = []
    for k in knobs.KNOBS:
        if (getattr(k, "task", None) == "train") != (task == "train"):
            continue
        default = "the preset's" if k.default == preset else _value(k.default)
        rows.append([f"`{k.key}`", _cell(k.help), default])
    return _table(["key", "meaning", "default"], rows)


def group_table() -> str:
    """Every config group of ``conf/`` that offers a choice (the experiments apart: they have
    their page) with its choices, the default first, and where the docs describe them."""
    conf = ROOT / "conf"
    defaults = {}
    for item in yaml.safe_load((conf / "config.yaml").read_text()).get("defaults", []):
        if isinstance(item, dict):
            for key, value in item.items():
                defaults[key.removeprefix("override ").strip()] = value
    groups = [p for p in sorted(conf.iterdir()) if p.is_dir() and p.name not in ("hydra", "experiment")]
    groups += [conf / "hydra" / g for g in ("launcher", "sweeper") if (conf / "hydra" / g).is_dir()]
    rows = []
    for group in groups:
        name = group.relative_to(conf).as_posix()
        choices = sorted(sorted(p.stem for p in group.glob("*.yaml")), key=lambda c: c != defaults.get(name))
        if len(choices) > 1:
            shown = [f"`{c}` (default)" if c == defaults.get(name) else f"`{c}`" for c in choices]
            rows.append([f"`{name}=`", ", ".join(shown), GROUP_PAGES.get(name, "")])
    return _table(["group", "choices", "described in"], rows)


#: where the docs describe a group's choices
GROUP_PAGES = {"model": "[Model families](models.md)",
               "norm": "[below](#the-general-block-and-the-norm-presets)",
               "size": "[Using rankexp](usage.md#sweeps-experiments-and-sizes)",
               "task": "[Probes](probes.md), [Training](training.md)",
               "tracking": "[Tracking](tracking.md)",
               "hydra/launcher": "[Running at scale](scale.md)",
               "hydra/sweeper": "[Using rankexp](usage.md#contour-sweeps)"}


def probe_table() -> str:
    """Every probe: the model families it runs on, its options with their defaults, what it
    measures (its function's docstring); the default probes marked."""
    from rankexp import probes

    default = set(getattr(probes, "DEFAULT_PROBES", ()))
    rows = []
    for name, p in probes.PROBES.items():
        options = ", ".join(f"`{k}={_value(v).strip('`')}`" for k, v in dict(p.options).items())
        label = f"`{name}`" + (" (default)" if name in default else "")
        rows.append([label, ", ".join(sorted(p.families)), options or "—", _cell(p.doc)])
    return _table(["probe", "models", "options (`task.options.<probe>.<key>`)", "what it measures"], rows)


@functools.cache
def _plan(experiment: str, size: str):
    from hydra_plugins.rankexp_plugins.grids import sweep_plan

    return sweep_plan(f"experiment={experiment}", f"size={size}")


def experiment_table(plan=None) -> str:
    """Every experiment of the registry: its title, the grids of its sweep at full size (their
    swept axes), its runs at each size, what it needs, the analysis commands that draw it (its
    registry lines, whole: as printed they run).
    ``plan(id, size)`` gives a sweep plan (``.axes``: grid → swept axes, ``.jobs``)."""
    from analysis.core.registry import default

    plan = plan or _plan
    rows = []
    for e in default():
        plans = [plan(e.id, size) for size in SIZES]
        grids = "; ".join(f"{g}: {' × '.join(axes) or '—'}" if g else " × ".join(axes) or "—"
                          for g, axes in plans[-1].axes.items())
        drawn = "<br>".join(f"`python -m analysis {a}`" for a in e.analyses) or "—"
        rows.append([f"`{e.id}`", e.part, _cell(e.title), _cell(grids),
                     " / ".join(str(len(p.jobs)) for p in plans), e.needs.text(), drawn])
    return _table(["id", "part", "what", "grids (swept axes at full size)", "runs smoke / cpu / full",
                   "needs", "drawn by (as printed, on the default store)"], rows)


TABLES = {"knobs": knob_table, "groups": group_table, "probes": probe_table,
          "experiments": experiment_table}


@functools.cache
def render(name: str, arg: str | None) -> str:
    if name not in TABLES or (arg and name != "knobs"):
        raise ValueError(f"unknown table marker {name!r}; known: {', '.join(TABLES)}")
    return TABLES[name](arg) if arg else TABLES[name]()


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: render(m.group(1), m.group(2)), markdown)
