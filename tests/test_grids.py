"""A sweep as a union of grids (``hydra.sweeper.grids``, hydra_plugins/rankexp_plugins/grids.py):
the expansion against the basic sweeper's own product, repeats left out, run names, and one real
two-grid sweep — one parent run, every grid's runs, the command line's axes in every grid, an
overlay that shrinks one grid, a grid left out from the command line, malformed grids refused."""

from __future__ import annotations

import itertools

import pytest
from conftest import runs_in
from hydra.core.override_parser.overrides_parser import OverridesParser
from plans import plan

from hydra_plugins.rankexp_plugins.grids import expand, named_grids, sweep_plan

PARSER = OverridesParser.create()


def product(**axes) -> set[tuple[str, ...]]:
    """Every job of the Cartesian product of ``axes`` (values as comma lists), order-free."""
    keys = [k.replace("__", ".") for k in axes]
    values = [str(v).split(",") for v in axes.values()]
    return {tuple(sorted(f"{k}={v}" for k, v in zip(keys, combo, strict=True)))
            for combo in itertools.product(*values)}


def jobs(plan) -> set[tuple[str, ...]]:
    return {tuple(sorted(j)) for j in plan.jobs}


def test_without_grids_it_is_the_basic_sweepers_product():
    """Hydra's basic sweeper's jobs and order: the product over the keys in order of
    appearance, the last key varying fastest; a plain override in every job; a range swept."""
    plan = expand({"norm": "pre,post", "alpha": "1,2"}, None, ["depth=range(4,12,4)", "width=16"],
                  PARSER)
    assert plan.jobs == [[f"norm={n}", f"alpha={a}", f"depth={d}", "width=16"]
                         for n in ("pre", "post") for a in (1, 2) for d in (4, 8)]
    assert plan.swept == ["norm", "alpha", "depth"] and set(plan.grid) == {""}
    with pytest.raises(ValueError, match="not an interval"):
        expand(None, None, ["alpha=interval(0,1)"], PARSER)


def test_each_grid_lays_its_keys_over_the_shared_params_and_the_command_line_over_both():
    plan = expand({"depth": "12,24", "alpha": "1"},
                  {"a": {"norm": "none", "norm.post": "none,rmsnorm"},
                   "b": {"norm": "pre", "alpha": "1,2"}}, ["width=8"], PARSER)
    a = product(depth="12,24", alpha="1", norm="none", norm__post="none,rmsnorm", width="8")
    b = product(depth="12,24", alpha="1,2", norm="pre", width="8")
    assert jobs(plan) == a | b and len(plan.jobs) == len(a) + len(b)
    assert plan.grid == ["a"] * len(a) + ["b"] * len(b)  # grid order, each grid's product
    assert plan.axes == {"a": ["depth", "norm.post"], "b": ["depth", "alpha"]}
    # a swept axis on the command line replaces that key in every grid
    plan = expand({"depth": "12,24"}, {"a": {"norm": "none"}, "b": {"norm": "pre", "depth": "48"}},
                  ["depth=4,8"], PARSER)
    assert jobs(plan) == product(depth="4,8", norm="none") | product(depth="4,8", norm="pre")


def test_a_job_two_grids_both_make_is_kept_once_and_a_list_of_grids_is_taken():
    plan = expand(None, [{"alpha": "1,2"}, {"alpha": "2,3"}], [], PARSER)
    assert [j for j in plan.jobs] == [["alpha=1"], ["alpha=2"], ["alpha=3"]]
    assert plan.grid == ["0", "0", "1"] and plan.dropped == [(["alpha=2"], "0")]
    assert named_grids([{"a": 1}, None]) == {"0": {"a": 1}, "1": {}}


@pytest.mark.parametrize("grids, message", [
    ("oops", "a mapping of grid name"),
    ({"a": "alpha=1"}, "hydra.sweeper.grids.a: a mapping of key"),
    ({"a": {"norm": {"op": "rmsnorm"}}}, "hydra.sweeper.grids.a.norm: one override"),
])
def test_malformed_grids_are_named(grids, message):
    # (GridError is a ValueError; Hydra's plugin scan re-executes the module, making a new class)
    with pytest.raises(ValueError, match=message):
        expand(None, grids, [], PARSER)


def test_names_lead_with_the_grid_and_differ_across_grids():
    plan = expand({"depth": "8"}, {"a": {"norm": "pre,post"}, "b": {"norm": "pre", "alpha": "1,2"}},
                  ["norm.op=rmsnorm"], PARSER)
    names = plan.names([f"base{i}" for i in range(len(plan.jobs))])
    assert names == ["a·pre", "a·post", "b·pre·α1", "b·pre·α2"]
    single = expand({"alpha": "1,2"}, None, ["norm=post"], PARSER)
    assert single.names(["x", "y"]) == ["post·α1", "post·α2"]  # one grid: no prefix, as before


def test_a_job_whose_config_another_grid_already_has_is_left_out():
    """fig15's two grids both hold Pre-RMSNorm with B = none (``norm.out=none`` is what the
    preset puts there): other overrides, one config — planned once, like fig4's R = none, L = 48."""
    fig15 = plan("fig15", "smoke")
    assert len(fig15.jobs) == 5 and len(fig15.dropped) == 1
    job, twin = fig15.dropped[0]
    assert "norm.out=none" in job and twin == "pre_op"
    fig4 = plan("fig4", "smoke")
    assert len(fig4.jobs) == 4 * 2 + 5 * 2 - 1 and fig4.grid.count("control") == 9


def test_a_two_grid_sweep_is_one_sweep_with_every_grids_runs(cli):
    """``rankexp experiment=fig15 size=smoke -m``: both grids in one sweep under one parent run,
    the planned configs exactly; the command line's depth goes to both grids; a grid can be left
    out; malformed grids fail before anything exists."""
    cli("experiment=fig15", "size=smoke", "depth=4", "-m")
    runs = runs_in(cli.uri, "fig15")
    parents = [r for r in runs if r.data.tags.get("rankexp.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("rankexp.role") != "sweep"]
    assert len(parents) == 1 and parents[0].data.metrics["jobs_total"] == 5
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    names = sorted(r.info.run_name for r in children)
    assert names == sorted(["pre_op·pre·layernorm", "pre_op·pre·rmsnorm", "out_op·pre·B:meansub",
                            "out_op·pre·B:layernorm", "out_op·pre·B:rmsnorm"])
    assert {r.data.params["depth"] for r in children} == {"4"}
    planned = sweep_plan("experiment=fig15", "size=smoke", "depth=4")
    assert len(planned.jobs) == len(children)
    # rerun with one grid left out: nothing new (resume by config hash), 2 jobs skipped
    out = cli("experiment=fig15", "size=smoke", "depth=4", "~hydra.sweeper.grids.out_op", "-m").stdout
    assert "0 finished, 2 skipped" in out, out[-2000:]
    bad = cli("experiment=fig15", "size=smoke", "+hydra.sweeper.grids.c=oops", "-m", check=False)
    assert bad.returncode == 2 and "hydra.sweeper.grids.c: a mapping of key" in bad.stdout
    assert len(runs_in(cli.uri, "fig15")) == 7  # the two parents and five jobs, nothing else
