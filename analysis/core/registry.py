"""The experiment registry: one :class:`Experiment` per ``conf/experiment/<id>.yaml``, the only
list of experiments (the docs, ``make figures``, the report and the tests read
:func:`default`).  Each lives in ``analysis/<part>/<id>.py`` beside its commands and claims;
what it shows is its config's ``tracking.description``."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import pkgutil
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from types import ModuleType

import yaml

from rankexp.locations import REPO_ROOT, resolve_path

from .claims import Claim

#: the document parts, in the documents' order: the study's core figures (§3), the rest of the
#: study (§4), the mean-field chapter (§5), the degradation replication, language models
PARTS = ("study", "rest", "meanfield", "degradation", "lm")


@dataclass(frozen=True)
class Needs:
    """What an experiment needs beyond this checkout and a CPU: the real CIFAR-10 archive
    (``data.root``), optional packages (``transformers``), training, a GPU at full size."""

    cifar10: bool = False
    packages: tuple[str, ...] = ()
    train: bool = False
    gpu_full: bool = False

    def missing(self) -> str:
        """What of it this machine lacks, as text ("" when nothing): CIFAR-10 under ``data.root``
        (``$RANKEXP_DATA``, else ``../shared/data``), an uninstalled package."""
        out = []
        if self.cifar10:
            from rankexp.tasks.data import ARCHIVE_NAME, FOLDER_NAME, TORCHVISION_FOLDER

            root = resolve_path(os.environ.get("RANKEXP_DATA") or "../shared/data")
            if not any((root / n).exists() for n in (ARCHIVE_NAME, FOLDER_NAME, TORCHVISION_FOLDER)):
                out.append("the CIFAR-10 data set (data.root, $RANKEXP_DATA or ../shared/data)")
        out += [f"the package {p}" for p in self.packages if importlib.util.find_spec(p) is None]
        return ", ".join(out)

    def text(self) -> str:
        """``CIFAR-10, training, GPU at full size, transformers`` (— for none)."""
        parts = (["CIFAR-10"] if self.cifar10 else []) + (["training"] if self.train else [])
        parts += (["GPU at full size"] if self.gpu_full else []) + list(self.packages)
        return ", ".join(parts) or "—"


@dataclass(frozen=True)
class Experiment:
    """One experiment of the documents (``conf/experiment/<id>.yaml`` is its sweeps).

    Attributes:
        id: the config's name and its MLflow experiment.
        title: one line, ``Figure 4: where the norm sits and what it does``.
        source: where the documents state it (``the study §3 fig4``).
        analyses: its ``python -m analysis`` command lines (without ``--uri``/``--out``).
        claims: the claims it decides.
        needs: what it needs (:class:`Needs`); reads: experiments whose runs it also reads.
        reproduce: part of ``make figures`` (the demo is not); part: filled in from its module."""

    id: str
    title: str
    source: str
    analyses: tuple[str, ...]
    claims: tuple[Claim, ...] = ()
    needs: Needs = field(default_factory=Needs)
    reads: tuple[str, ...] = ()
    reproduce: bool = True
    part: str = ""

    @functools.cached_property
    def shows(self) -> str:
        """What it shows: its config's ``tracking.description`` as one paragraph, without the
        example command lines ("" without a config or a description)."""
        path = REPO_ROOT / "conf" / "experiment" / f"{self.id}.yaml"
        config = yaml.safe_load(path.read_text()) if path.is_file() else None
        text = ((config or {}).get("tracking") or {}).get("description") or ""
        return " ".join(line.strip() for line in text.splitlines()
                        if line.strip() and not line.lstrip().startswith(("python -m", "rankexp ")))

    def argvs(self) -> list[list[str]]:
        """Each analysis command as argv (``["heatmap", "--experiment", "fig2", …]``)."""
        return [shlex.split(a) for a in self.analyses]

    def bound_claims(self) -> tuple[Claim, ...]:
        """Its claims, each with ``experiment`` set to this id and ``requires`` to what this
        machine lacks of :attr:`needs`."""
        missing = self.needs.missing()
        return tuple(replace(c, experiment=self.id, requires=missing) for c in self.claims)


def _natural(experiment_id: str) -> tuple:
    """``fig2`` < ``fig10`` < ``tab1`` < ``train_spectra``: figures, tables, the rest; by number."""
    kind = next((i for i, p in enumerate(("fig", "tab")) if experiment_id.startswith(p)), 2)
    return kind, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", experiment_id)]


class Registry:
    """The experiments in document order (by part, then figures, tables, the rest, by number).

    Raises:
        ValueError: a repeated experiment or claim id, a ``reads`` naming no entry."""

    def __init__(self, entries: Iterable[Experiment]):
        order = {p: i for i, p in enumerate(PARTS)}
        self.entries = sorted(entries, key=lambda e: (order.get(e.part, len(PARTS)), not e.reproduce,
                                                      _natural(e.id)))
        ids = self.ids()
        for what, names in (("experiments", ids), ("claims", [c.id for c in self.claims()])):
            twice = sorted({i for i in names if names.count(i) > 1})
            if twice:
                raise ValueError(f"{what} registered twice: {twice}")
        for e in self.entries:
            unknown = [r for r in e.reads if r not in ids]
            if unknown:
                raise ValueError(f"experiment {e.id} reads unknown experiment(s) {unknown}")
        self._by_id = {e.id: e for e in self.entries}

    def __iter__(self) -> Iterator[Experiment]:
        return iter(self.entries)

    def __contains__(self, experiment_id: object) -> bool:
        return experiment_id in self._by_id

    def __getitem__(self, experiment_id: str) -> Experiment:
        """The entry of ``experiment_id``. Raises KeyError naming the known ids."""
        try:
            return self._by_id[experiment_id]
        except KeyError:
            raise KeyError(f"no experiment {experiment_id!r}; registered: {', '.join(self.ids())}") from None

    def ids(self) -> list[str]:
        return [e.id for e in self.entries]

    def claims(self) -> list[Claim]:
        """Every claim, bound to its experiment (:meth:`Experiment.bound_claims`)."""
        return [c for e in self.entries for c in e.bound_claims()]

    def with_entries(self, *extra: Experiment) -> Registry:
        """This registry with ``extra`` entries added (an entry with a known id replaces it)."""
        ids = {e.id for e in extra}
        return Registry([e for e in self.entries if e.id not in ids] + list(extra))


@functools.cache
def modules() -> tuple[ModuleType, ...]:
    """Every module of every document part (``analysis/<part>/*.py``, parts in :data:`PARTS`
    order, modules by name), and the report's (which holds the ``report`` command)."""
    found = []
    for part in PARTS:
        pkg = importlib.import_module(f"analysis.{part}")
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            found.append(importlib.import_module(f"{pkg.__name__}.{info.name}"))
    found.append(importlib.import_module("analysis.core.report"))
    return tuple(found)


@functools.cache
def default() -> Registry:
    """The registry of this checkout: every ``EXPERIMENTS`` entry of the parts' modules."""
    entries = []
    for module in modules():
        part = module.__name__.split(".")[1]
        entries += [replace(e, part=part) for e in getattr(module, "EXPERIMENTS", ())]
    return Registry(entries)
