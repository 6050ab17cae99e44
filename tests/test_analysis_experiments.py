"""Every experiment of the registry, as a user runs it: ``rankexp experiment=<id> size=smoke -m``
yields exactly the runs its grids plan (every grid, repeats left out, one parent run), every
analysis command of its entry draws from them publication-ready figures that separate every run
they read (no "runs differ in …" averaging), and every claim its entry lists is decided —
*not run* only where it needs a larger size or data no grid makes (``Claim.size``,
``Claim.needs``), never for a run its grids should have made.

The registry is the list: its ids are the configs of ``conf/experiment/``, its commands exist.
Experiments whose smoke size trains on CIFAR-10 (``Needs.train``, theirs or a read one's) run here under ``-m slow``:
their training loops are the subject of test_analysis_training / _meanfield / _degradation, and
they skip (saying why) where the data set is missing.  The default run sweeps a representative
few (``DEFAULT``: the demo, a two-grid sweep with a twin left out, the contour sweeper, and the
mean-field part, whose stores test_analysis_meanfield reads anyway); every other experiment's
smoke store runs under ``-m slow``, and every experiment's smoke sweep is composed and planned in
the default run by test_sizes / test_conventions.  The ``cpu`` sizes (``make figures``) run
under ``-m slow`` for every experiment that does not train.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import runs_in
from figure_checks import problems
from plans import composed, plan
from smoke_stores import sweep, uri_of

from analysis.core import claims
from analysis.core.registry import PARTS, Registry, default
from analysis.core.runner import commands, parser, run
from analysis.core.style import recording
from rankexp.cli import CONF_DIR

REGISTRY = default()
#: the experiments whose smoke store and analyses the default run checks (the rest: ``-m slow``)
DEFAULT = {"demo", "fig4", "tab4_contour", *(e.id for e in REGISTRY if e.part == "meanfield")}


def trains(name: str) -> bool:
    """It, or an experiment whose runs it reads, trains (``Needs.train``)."""
    entry = REGISTRY[name]
    return entry.needs.train or any(REGISTRY[e].needs.train for e in entry.reads)


def case(name: str, slow: bool = False):
    """One experiment as a test case: slow if asked or if it (or an experiment it reads)
    trains; skipped where it (or an experiment it reads) needs what this machine lacks."""
    entry = REGISTRY[name]
    marks = [pytest.mark.slow] if slow or trains(name) else []
    missing = ", ".join(m for m in (REGISTRY[e].needs.missing() for e in (*entry.reads, name)) if m)
    marks.append(pytest.mark.skipif(bool(missing), reason=f"{name} needs {missing}"))
    return pytest.param(name, marks=marks)


def job_runs(uri: str, name: str) -> list:
    return [r for r in runs_in(uri, name) if r.data.tags.get("rankexp.role") != "sweep"]


def check_runs(folder: Path, name: str, size: str) -> None:
    """The store holds exactly the runs the experiment's grids plan, all FINISHED at ``size``,
    under one parent run, with distinct names."""
    runs = job_runs(uri_of(folder), name)
    planned = plan(name, size)
    parents = [r for r in runs_in(uri_of(folder), name) if r.data.tags.get("rankexp.role") == "sweep"]
    if parents and "contour_cells" in parents[0].data.metrics:  # hydra/sweeper=contour: its rounds
        # plan the jobs; the grid is its trace points, each measured at ≥ 2 values of the axis
        assert len(runs) == int(parents[0].data.tags["jobs_total"]) >= 2 * len(planned.jobs)
        assert parents[0].data.metrics["contour_converged"] >= 1, parents[0].data.metrics
    else:
        assert len(runs) == len(planned.jobs), (name, len(runs), len(planned.jobs))
    assert {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_name, r.info.status) for r in runs]
    assert {r.data.params["size"] for r in runs} == {size}
    assert len({r.info.run_name for r in runs}) == len(runs)
    assert len({r.data.tags["mlflow.parentRunId"] for r in runs}) == 1


@functools.cache
def docs_table() -> str:
    """The docs' experiment table as the site prints it (docs/hooks.py; no sweep planned)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", Path(CONF_DIR).parent / "docs"
                                                  / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.experiment_table(plan=lambda e, size: SimpleNamespace(axes={}, jobs=()))


def printed_commands(name: str) -> list[list[str]]:
    """The ``python -m analysis …`` commands the docs' table prints for ``name``, as argv."""
    row = re.search(rf"^\| `{name}` \|.*$", docs_table(), re.M)[0]
    return [shlex.split(c)[3:] for c in re.findall(r"`(python -m analysis [^`]+)`", row)]


def check_analyses(folder: Path, name: str) -> None:
    """Every analysis command the docs print for the entry, run as printed, exits 0, writes
    files, draws publication-ready figures and averages no runs whose configs differ in a key
    it does not separate."""
    printed = printed_commands(name)
    assert len(printed) == len(REGISTRY[name].analyses), (name, printed)
    for argv in printed:
        with recording() as figs:
            rc, text, files = run(argv, folder / "figures", uri_of(folder))
            assert rc == 0, f"python -m analysis {' '.join(argv)} exited {rc}:\n{text[-3000:]}"
            assert files and all(f.stat().st_size > 0 for f in files), (argv, files)
            assert "which this figure does not separate" not in text, (argv, text[-2000:])
            for fig in figs:  # publication-ready (tests/figure_checks.py)
                found = problems(fig)
                assert not found, f"{argv[0]}, figure {fig.get_label()}:\n" + "\n".join(found)


def check_claims(folder: Path, name: str) -> None:
    """Every claim of the entry is decided, or not run for its size or its data only."""
    runs = claims.Runs(uri_of(folder))
    try:
        verdicts = claims.evaluate(runs, list(REGISTRY[name].bound_claims()))
    finally:
        runs.close()
    bad = [(v.claim.id, v.verdict, v.note) for v in verdicts
           if v.verdict == claims.ERROR or (v.verdict == claims.NOT_RUN and v.why not in ("size", "data"))]
    assert not bad, bad


@pytest.mark.parametrize("name", [case(e.id, slow=e.id not in DEFAULT) for e in REGISTRY])
def test_experiment_runs_at_smoke_size_its_analysis_draws_and_its_claims_are_decided(name, smoke_store):
    folder = smoke_store(name)
    for exp in (*REGISTRY[name].reads, name):
        check_runs(folder, exp, "smoke")
    check_analyses(folder, name)
    check_claims(folder, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [case(e.id) for e in REGISTRY if not trains(e.id)])
def test_experiment_runs_at_cpu_size_and_its_analysis_draws(name, tmp_path):
    for exp in (*REGISTRY[name].reads, name):
        sweep(exp, "cpu", tmp_path)
        check_runs(tmp_path, exp, "cpu")
    check_analyses(tmp_path, name)


def test_the_registry_is_the_list_of_experiments():
    """One entry per config, every command it names exists and parses, what it reads exists,
    every claim id is unique and states its numbers."""
    configs = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
    assert sorted(REGISTRY.ids()) == configs
    known, p = commands(), parser()
    for entry in REGISTRY:
        assert entry.analyses and entry.title and entry.source and entry.shows, entry.id
        for argv in entry.argvs():
            assert argv[0] in known, (entry.id, argv)
            p.parse_args(argv)  # the options exist (argparse exits 2 otherwise)
    ids = [c.id for c in REGISTRY.claims()]
    assert len(ids) == len(set(ids)) >= 80
    for c in REGISTRY.claims():
        assert c.statement and c.source and c.study and c.check.text and c.experiment in REGISTRY, c.id
    with pytest.raises(ValueError, match="registered twice"):
        Registry([*REGISTRY, REGISTRY["fig1"]])


def test_what_an_entry_says_it_needs_is_what_its_config_runs():
    """``Needs.train``: its full size trains; ``cifar10``: it trains or its model reads
    CIFAR-10 (the ConvNets); ``transformers``: its model is a Hugging Face LM."""
    for entry in REGISTRY:
        cfg = composed(entry.id)
        trains, model = cfg.task.name == "train", cfg.model.name
        assert entry.needs.train == trains, entry.id
        assert entry.needs.cifar10 == (trains or model == "cifar_resnet"), entry.id
        assert ("transformers" in entry.needs.packages) == (model == "gpt2"), entry.id


def test_the_core_imports_no_document_part():
    """No import circle: the core (runner, registry, report, claims, loader) imports no part; the
    parts are found when the registry or the runner is first asked — and reading them twice
    registers nothing twice (there is nothing to register: modules only declare)."""
    import subprocess
    import sys

    code = ("import sys, analysis, analysis.__main__, analysis.figures, analysis.core.runner, "
            "analysis.core.report, analysis.core.registry, analysis.core.claims, analysis.core.select\n"
            "parts = [m for m in sys.modules if m.split('.')[:2] in "
            f"{[['analysis', p] for p in PARTS]}]\n"
            "assert not parts, parts\n"
            "from analysis.core import registry, runner\n"
            "a, b = registry.Registry(registry.default()), registry.default()\n"
            "assert [e.id for e in a] == [e.id for e in b] and len(runner.commands()) >= 35\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
