"""``hydra/sweeper=contour`` and its math (hydra_plugins/rankexp_plugins/contour.py): crossings against closed forms,
cells it must report instead of guessing, and a real contour sweep — killed after its first
round, then resumed from the store — whose crossings and exponent are known exactly."""

from __future__ import annotations

import io
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, runs_in

from hydra_plugins.rankexp_plugins.contour import Axis, Contour, fit_exponent, parse_spec, solve

AXIS = Axis("alpha", 0.1, 10.0, "log")


def sigmoid_rank(alpha: float, depth: float) -> float:
    """An erank-like curve falling with βα^M√L (M = 2): 1/(1 + (α²√L)²); it equals r* at
    α*(L) = ((1/r* − 1)^{1/2} / √L)^{1/2}, so βα*^M ∝ L^{−1/2} exactly."""
    return 1.0 / (1.0 + (alpha**2 * math.sqrt(depth)) ** 2)


def closed_alpha(level: float, depth: float) -> float:
    return ((1 / level - 1) ** 0.5 / math.sqrt(depth)) ** 0.5


def run_in_process(state: Contour, evaluate) -> None:
    """The sweeper's rounds with ``evaluate(t, x) -> (metric, nominal ratio)`` in place of jobs."""
    jobs = state.first_round()
    while jobs:
        state.record(jobs, [evaluate(t, x) for t, x in jobs])
        jobs = state.next_round()
        if state.rounds >= state.spec.max_rounds:
            break


def replay(spec_node: dict, depths, f) -> Contour:
    """Run the sweeper's rounds in this process with ``f(alpha, depth)`` as every job's result."""
    state = Contour(parse_spec(spec_node), [[f"depth={L}"] for L in depths], ["depth"])
    run_in_process(state, lambda t, x: (f(x, depths[t]), x**2))
    return state


SPEC = {"metric": "m", "levels": [0.4, 0.5, 0.6], "axis": "alpha", "bracket": [0.1, 10.0],
        "start": 4, "tol": 0.02, "fit_over": "depth"}


@pytest.mark.parametrize("method", ["secant", "bisect"])
def test_contour_of_a_closed_form_curve_finds_every_crossing_and_the_exponent(method):
    depths = [12, 48, 192]
    state = replay({**SPEC, "method": method}, depths, sigmoid_rank)
    contour, fits = state.tables()
    assert (contour["status"] == "converged").all(), contour
    for _, row in contour.iterrows():
        exact = closed_alpha(row["level"], float(row["depth"]))
        assert row["lo"] <= exact <= row["hi"]  # the bracket holds the true crossing …
        assert math.log(row["hi"] / row["lo"]) <= 0.02 * (1 + 1e-9)  # … to the tolerance
        assert abs(math.log(row["crossing"] / exact)) < 1e-3  # interpolated far inside it
    assert np.allclose(fits["s"], -0.5, atol=2e-3), fits  # βα^M = α² ∝ L^{-1/2}
    assert (fits["points"] == 3).all()
    assert ((fits["s_lo"] <= -0.5) & (-0.5 <= fits["s_hi"])).all() or np.allclose(fits["s"], -0.5, atol=1e-3)
    runs = sum(len(v) for v in state.values)
    if method == "secant":  # the safeguarded secant beats bisection's ⌈log2(4.6/3 / 0.02)⌉ ≈ 7 rounds
        assert state.rounds <= 5 and runs <= 3 * (4 + 3 * 2 * 4), (state.rounds, runs)


def test_boolean_boundary_by_bisection_counts_a_missing_value_as_failed():
    """Table 5's boundary: ``ok`` when the metric ≥ 0.4; a diverged run (NaN) is not ok."""
    lr_max = 10 ** -2.5
    axis = Axis("lr", 1e-5, 1e-1, "log")
    acc = {x: (0.55 if x <= lr_max else math.nan) for x in axis.start(5)}
    for _ in range(20):
        cell = solve(acc, 0.4, axis, 0.1, boolean=True)
        if cell.status != "open":
            break
        acc.update({x: (0.55 if x <= lr_max else math.nan) for x in cell.proposals})
    assert cell.status == "converged" and cell.lo <= lr_max <= cell.hi
    assert abs(math.log10(cell.crossing) - math.log10(lr_max)) <= 0.1 / 2 / math.log(10) + 1e-12
    # the same data as a level target: NaNs say nothing, so the level is never crossed
    assert solve(acc, 0.4, axis, 0.1).status == "unbracketed"
    # rates too small to reach 0.4 in the steps given fail too: failing below and holding
    # above is a floor, not the boundary (stable below it) — reported, not converged …
    floor = {1e-5: math.nan, 1e-3: 0.5, 1e-1: 0.5}
    cell = solve(floor, 0.4, axis, 0.1, boolean=True)
    assert cell.status == "unbracketed" and "wrong way" in cell.note and math.isnan(cell.crossing)
    # … a floor below a boundary leaves the boundary (above the floor) to bisect, noted …
    cell = solve({**floor, 1e-1: math.nan}, 0.4, axis, 0.1, boolean=True)
    assert cell.status == "open" and (cell.lo, cell.hi) == (1e-3, 1e-1) and "floor" in cell.note
    # … and holding again above a failing stretch is not a boundary: non-monotone
    window = {1e-5: 0.5, 1e-3: math.nan, 1e-1: 0.5}
    assert solve(window, 0.4, axis, 0.1, boolean=True).status == "non_monotone"


def test_cells_that_cannot_be_solved_are_reported_not_guessed():
    xs = AXIS.start(5)  # 0.1, 0.316, 1, 3.16, 10
    flat = solve({x: 0.9 for x in xs}, 0.5, AXIS, 0.02)
    assert flat.status == "unbracketed" and not flat.proposals and math.isnan(flat.crossing)
    assert "0.9" in flat.note
    bump = solve(dict(zip(xs, [0.9, 0.3, 0.8, 0.2, 0.1], strict=True)), 0.5, AXIS, 0.02)
    assert bump.status == "non_monotone" and not bump.proposals and "3 times" in bump.note
    touch = solve(dict(zip(xs, [0.9, 0.5, 0.9, 0.8, 0.7], strict=True)), 0.5, AXIS, 0.02)
    assert touch.status == "non_monotone"  # touches the level and turns back: not a crossing
    one = solve({0.1: 0.9, 1.0: math.nan}, 0.5, AXIS, 0.02)  # a failed run is no evidence
    assert one.status == "unbracketed" and one.points == 1
    hit = solve(dict(zip(xs, [0.9, 0.7, 0.5, 0.2, 0.1], strict=True)), 0.5, AXIS, 0.02)
    assert hit.status == "converged" and hit.crossing == 1.0 and hit.width == 0.0
    # through the state's tables: the exponent is fitted on converged cells only
    state = replay({**SPEC, "levels": [0.5, 0.999]}, [12, 48], sigmoid_rank)
    contour, fits = state.tables()
    assert set(contour.loc[contour["level"] == 0.999, "status"]) == {"unbracketed"}
    assert fits.set_index("level").loc[0.999, "points"] == 0


DEPTHS = [12, 24, 48, 96, 192]


def test_warm_starts_and_the_exponent_budget_reach_the_exponent_with_a_third_of_the_runs():
    """Warm starts along depth (each depth measured around the crossing its settled neighbours'
    power law predicts) and cells stopped at the error the exponent can take (``s_tol``): on
    the closed form every crossing is found, s = −1/2 within s_tol, with ≤ 40 % of the runs of
    bracketing every cell to tol (95 runs here); the interior depths take one run per level."""
    plain = replay({**SPEC, "start": 3}, DEPTHS, sigmoid_rank)
    smart = replay({**SPEC, "start": 3, "warm": True, "s_tol": 0.01}, DEPTHS, sigmoid_rank)
    runs = [sum(len(v) for v in st.values) for st in (plain, smart)]
    contour, fits = smart.tables()
    assert (contour["status"] == "converged").all(), contour
    assert np.allclose(fits["s"], -0.5, atol=0.01) and (fits["points"] == len(DEPTHS)).all(), fits
    assert runs[1] <= 0.4 * runs[0], runs
    assert [len(smart.values[t]) for t in (1, 2, 3)] == [3, 3, 3], smart.values
    for _, row in contour.iterrows():  # the bracket holds the exact crossing (nothing guessed)
        assert row["lo"] <= closed_alpha(row["level"], float(row["depth"])) <= row["hi"], row
    # the budget follows the fit's weights: the middle depth (weight 0) may take any error,
    # the ends (largest |log L − mean|) the least; Σ|w|·M·e = s_tol
    allowed = [smart.allowed(t, 0.5) for t in range(len(DEPTHS))]
    assert allowed[2] == math.inf and math.isclose(allowed[0], allowed[4]) and \
        math.isclose(allowed[1], allowed[3]) and allowed[0] < allowed[1]
    w = np.log(DEPTHS) - np.log(DEPTHS).mean()
    w = w / (w @ w)
    spent = sum(abs(wi) * 2 * a for wi, a in zip(w, allowed, strict=True) if math.isfinite(a))
    assert math.isclose(spent, 0.01, rel_tol=1e-9), spent


def test_a_warm_start_that_misses_steps_out_and_a_boundary_warm_starts_to_two_runs():
    """A prediction off the crossing (a curve whose crossing jumps between depths) leaves the
    cell unbracketed near the guess: it steps outwards until it brackets it, never guessing;
    a level outside the bracket is reported unbracketed once the bracket's end is measured.
    A boolean boundary (Table 5: lr*(L) = 10^-2·L^-1/2, stable below) warm-starts each
    interior depth at two rates ±tol/2 around the prediction: two runs, the midpoint within
    ±tol/2 of the exact boundary, and s = −1/2 from the crossings themselves (the rate leaves
    βα^M alone)."""
    def jumpy(shift):
        return lambda alpha, depth: sigmoid_rank(alpha * (shift if depth == 48 else 1.0), depth)

    spec = {**SPEC, "start": 3, "warm": True, "s_tol": 0.01, "levels": [0.5], "max_rounds": 40}
    st = replay(spec, DEPTHS, jumpy(2.0))  # α*(48) half the power law's: 0.69 off in log α
    contour = st.tables()[0].set_index("depth")
    assert (contour["status"] == "converged").all(), contour
    assert contour.loc["48", "lo"] <= closed_alpha(0.5, 48) / 2 <= contour.loc["48", "hi"], contour
    assert len(st.values[2]) > 2  # it stepped out beyond the two points around the prediction
    st = replay(spec, DEPTHS, jumpy(1e-3))  # α*(48) far above the bracket's end 10
    contour = st.tables()[0].set_index("depth")
    assert contour.loc["48", "status"] == "unbracketed", contour
    assert max(st.values[2]) == 10.0, "reported unbracketed before the bracket's end was measured"

    def stable(lr, depth):
        return 0.5 if lr <= 1e-2 / math.sqrt(depth) else math.nan

    spec = {"metric": "max_stable_lr", "levels": [0.0], "axis": "lr", "bracket": [3e-5, 1e-1],
            "boolean": True, "start": 3, "tol": math.log(10) / 2, "method": "bisect",
            "fit_over": "depth", "warm": True}
    st = Contour(parse_spec(spec), [[f"depth={L}"] for L in DEPTHS], ["depth"])
    run_in_process(st, lambda t, x: (stable(x, DEPTHS[t]), 1.0))
    contour, fits = st.tables()
    assert (contour["status"] == "converged").all(), contour
    exact = 1e-2 / np.sqrt(contour["depth"].astype(float))
    assert np.all(np.abs(np.log10(contour["crossing"] / exact)) <= 0.25 + 1e-9), contour
    assert [len(st.values[t]) for t in (1, 2, 3)] == [2, 2, 2], st.values
    assert abs(fits["s"].iloc[0] + 0.5) < 0.15 and contour["nominal_ratio"].isna().all(), fits


def test_secant_safeguard_halves_the_bracket_at_least_every_second_round():
    """A curve the secant models badly (e^{30x}: interpolation from the flat end keeps landing
    on one side; unguarded it needs 80 rounds here): each two rounds at least halve it."""
    axis = Axis("x", 0.0, 1.0, "linear")
    root = math.log(2) / 30
    f = {x: math.exp(30 * x) for x in axis.start(3)}
    widths, prev = [], math.inf
    for _ in range(80):
        cell = solve(f, 2.0, axis, 1e-6, previous_width=prev)
        widths.append(cell.width)
        if cell.status != "open":
            break
        prev = cell.width
        f.update({x: math.exp(30 * x) for x in cell.proposals})
    assert cell.status == "converged" and cell.lo <= root <= cell.hi and len(widths) <= 20
    assert all(w2 <= 0.5 * w0 * (1 + 1e-9) for w0, w2 in zip(widths, widths[2:], strict=False)), widths


def test_fit_exponent_interval_and_resolution():
    L = np.array([12, 24, 48, 96, 192.0])
    exact = fit_exponent(L, 3 * L**-0.5, err=np.full(5, 0.01))
    assert exact.s == pytest.approx(-0.5, abs=1e-12) and exact.hi - exact.lo < 1e-9
    # worst case of ±0.01 in log y on the slope: Σ|x_i − x̄| / Σ(x_i − x̄)² · 0.01
    dx = np.log(L) - np.log(L).mean()
    assert exact.resolution == pytest.approx(0.01 * np.abs(dx).sum() / (dx @ dx))
    rng = np.random.default_rng(0)
    cover = [fit_exponent(L, L**-0.5 * np.exp(0.05 * rng.standard_normal(5))) for _ in range(400)]
    inside = np.mean([f.lo <= -0.5 <= f.hi for f in cover])
    assert 0.92 <= inside <= 0.98, inside  # a 95 % interval
    assert math.isnan(fit_exponent([12, 24], [1, 0.7]).lo)


def test_bad_contour_specs_are_one_line_errors():
    for bad, says in [({**SPEC, "bracket": [2, 1]}, "lo < hi"), ({**SPEC, "scale": "ln"}, "log or linear"),
                      ({**SPEC, "method": "newton"}, "secant or bisect"), ({**SPEC, "tol": 0}, "tol > 0"),
                      ({**SPEC, "levels": "x"}, "levels"), ({**SPEC, "wat": 1}, "unknown"),
                      ({k: v for k, v in SPEC.items() if k != "axis"}, "axis"),
                      ({**SPEC, "s_tol": -1}, "s_tol"), ({**SPEC, "warm": "yes"}, "warm"),
                      ({**SPEC, "fit_over": None, "warm": True}, "warm"),
                      ({**SPEC, "warm_across": ["expansion"]}, "warm_across"),
                      ({**SPEC, "warm": True, "warm_across": ["depth"]}, "warm_across")]:
        with pytest.raises(ValueError, match=says):
            parse_spec(bad)


# --------------------------------------------------------------------------- a real contour sweep
LEVEL = 1.0  # depth_factor = βα^M√L = 1 at α*(L) = L^{-1/4}: βα*^2 = L^{-1/2} exactly
SWEEP = ("hydra/sweeper=contour", "width=4", "depth=4,16,64", "seeds=1", "task.probes=[stream]",
         "hydra.sweeper.contour.metric=depth_factor", f"hydra.sweeper.contour.levels=[{LEVEL},1e6]",
         "hydra.sweeper.contour.bracket=[0.25,1.0]", "hydra.sweeper.contour.start=3",
         "hydra.sweeper.contour.tol=0.1", "tracking.experiment=contour")


def _artifact(uri: str, run_id: str, name: str) -> pd.DataFrame:
    from mlflow.tracking import MlflowClient

    path = MlflowClient(uri).download_artifacts(run_id, f"contour/{name}")
    return pd.read_csv(path) if name.endswith(".csv") else pd.read_json(io.StringIO(open(path).read()))


@pytest.mark.slow  # ~25 s; resume by config hash: test_resume, test_cli's rerun (default run)
def test_contour_sweep_killed_after_a_round_resumes_from_the_store(cli):
    """SIGTERM once the first round's 9 jobs are FINISHED: exit 143, the parent KILLED with the
    contour so far attached; the rerun reuses those runs (SKIPPED) and every crossing of the
    closed form lies in its final bracket; s = −1/2 within the contour's resolution."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    env["PYTHONPATH"] = str(REPO)
    # every job computes 1 s longer (idle): on a quiet machine the whole contour would otherwise
    # end between two polls, before the signal (rankexp.app._fault_injection)
    env["RANKEXP_FAULT_SLEEP"] = "1"
    p = subprocess.Popen([sys.executable, "-m", "rankexp", *SWEEP, "-m"], cwd=cli.cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        states = [s.read_text() for s in cli.cwd.glob("multirun/*/*/*/status.json")]
        if sum('"FINISHED"' in s for s in states) >= 9 and len(states) >= 10:
            break  # round 1 done and round 2 begun: the signal lands in a job
        time.sleep(0.2)
    assert p.poll() is None, "the sweep ended before its first round was done and it was signalled"
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 128 + signal.SIGTERM, out[-3000:]
    first = {r.info.run_id: r for r in runs_in(cli.uri, "contour")}
    parent1 = next(r for r in first.values() if r.data.tags.get("rankexp.role") == "sweep")
    assert parent1.info.status == "KILLED"
    assert not [r for r in first.values() if r.info.status == "RUNNING"]
    finished1 = {r.data.tags["config_hash"] for r in first.values()
                 if r.info.status == "FINISHED" and "config_hash" in r.data.tags}
    assert len(finished1) >= 9

    cli(*SWEEP, "-m")
    runs = runs_in(cli.uri, "contour")
    parent = next(r for r in runs if r.data.tags.get("rankexp.role") == "sweep" and r.info.run_id not in first)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["jobs_skipped"] >= len(finished1)  # every finished run reused
    new = [r for r in runs if r.info.run_id not in first and r.data.tags.get("rankexp.role") != "sweep"]
    assert not {r.data.tags["config_hash"] for r in new} & finished1  # … and none redone
    assert parent.data.metrics["jobs_total"] == int(parent.data.tags["jobs_total"])
    contour = _artifact(cli.uri, parent.info.run_id, "contour.csv")
    assert len(contour) == 6  # 3 depths × 2 levels
    solved = contour[contour["level"] == LEVEL]
    assert (solved["status"] == "converged").all(), solved
    for _, row in solved.iterrows():
        exact = row["depth"] ** -0.25
        assert row["lo"] <= exact <= row["hi"] and math.log(row["hi"] / row["lo"]) <= 0.1 * (1 + 1e-9)
        assert row["nominal_ratio"] == pytest.approx(row["depth"] ** -0.5, rel=0.1)
    assert set(contour.loc[contour["level"] == 1e6, "status"]) == {"unbracketed"}
    fits = _artifact(cli.uri, parent.info.run_id, "exponents.json").set_index("level")
    s = fits.loc[LEVEL]
    assert abs(s["s"] + 0.5) <= s["resolution"] and s["points"] == 3
    assert fits.loc[1e6, "points"] == 0
    assert parent.data.metrics["contour_converged"] == 3


def test_table5_from_one_rate_runs_is_each_cells_boundary():
    """``analysis table5`` on one-rate runs (``experiment=tab5_boundary``): each cell's value is
    the geometric midpoint of its largest stable rate and the next unstable one (the sweeper's
    boundary), the largest stable rate where none above it failed, — where none was stable;
    runs of a grid (task.lrs, no ``lr``) keep their logged max_stable_lr."""
    from analysis.core.select import PLACEMENT
    from analysis.study.fig6_train import one_rate, table5

    nan = math.nan
    rows = [("post", 12, 1e-4, 1e-4), ("post", 12, 1e-3, 1e-3), ("post", 12, 3e-3, nan),
            ("post", 12, 1e-2, nan), ("post", 12, 3e-5, 3e-5),
            ("post", 24, 1e-3, 1e-3), ("post", 24, 1e-2, 1e-2),
            ("pre", 12, 1e-3, nan), ("pre", 12, 1e-2, nan)]
    df = pd.DataFrame([{PLACEMENT: p, "depth": d, "alpha": 1.0, "lr": lr, "max_stable_lr": m}
                       for p, d, lr, m in rows])
    assert one_rate(df)
    table = table5(df)["alpha=1"]
    assert math.isclose(table[("post", 12)], math.sqrt(1e-3 * 3e-3))
    assert table[("post", 24)] == 1e-2 and math.isnan(table[("pre", 12)])
    grid = df.assign(lr=None)
    assert not one_rate(grid)
    seeds = table5(grid)["alpha=1"]  # a grid's runs in one cell are seeds: the rate all held
    assert seeds[("post", 24)] == 1e-3 and math.isnan(seeds[("post", 12)])


def test_warm_across_starts_each_line_from_its_leaders_crossing_at_the_same_depth():
    """``warm_across: [expansion]``: the m/d=4 line (the closed form with α scaled by 1.05, so
    α* 5 % lower at every depth) starts no depth from the bracket; each is measured around the
    m/d=1 crossing at its depth (shifted by the lines' offset once known): every cell converges
    with the exact crossing in its bracket, s = −1/2 within s_tol, one run per level at the
    follower's interior depths, and fewer runs in all than warm starts along depth alone."""
    spec = {**SPEC, "start": 3, "warm": True, "s_tol": 0.01}
    trace = [[f"expansion={e}", f"depth={L}"] for e in (1, 4) for L in DEPTHS]
    scale = {"1": 1.0, "4": 1.05}

    def run(node):
        st = Contour(parse_spec(node), trace, ["expansion", "depth"])
        run_in_process(st, lambda t, x: (sigmoid_rank(x * scale[st.labels[t]["expansion"]],
                                                     float(st.labels[t]["depth"])), x**2))
        return st

    along, across = run(spec), run({**spec, "warm_across": ["expansion"]})
    contour, fits = across.tables()
    assert (contour["status"] == "converged").all(), contour
    assert np.allclose(fits["s"], -0.5, atol=0.01), fits
    for _, row in contour.iterrows():
        exact = closed_alpha(row["level"], float(row["depth"])) / scale[row["expansion"]]
        assert row["lo"] <= exact <= row["hi"], row
    # the follower's ends start before any offset is known (0.05 off: more than tol), its
    # interior depths around the leader's crossing shifted by the ends' offset
    assert [len(across.values[t]) for t in range(6, 9)] == [3] * 3, across.values
    assert max(len(across.values[t]) for t in (5, 9)) <= 5, across.values
    assert sum(map(len, across.values)) < sum(map(len, along.values))
    assert across.donor == {5 + k: k for k in range(5)}


def test_a_boundary_whose_donor_held_everywhere_takes_one_run_at_the_top():
    """``warm_across: [alpha]`` on a boolean target: α = 4's cells start from α = 1's at the
    same depth, and a line's second depth from its first.  α = 1 at L = 12 stable over the
    whole bracket → every other cell measured once, at the top: stable there → unbracketed
    like its neighbour (Table 5 reads the top); unstable there → it bisects from the bracket
    (never guessed).  A neighbour stable nowhere sends the next cell to the bottom once."""
    spec = {"metric": "max_stable_lr", "levels": [0.0], "axis": "lr", "bracket": [3e-5, 1e-2],
            "boolean": True, "start": 3, "tol": math.log(10) / 2, "method": "bisect",
            "fit_over": "depth", "warm": True, "warm_across": ["alpha"]}
    trace = [[f"alpha={a}", f"depth={L}"] for a in (1, 4) for L in (12, 24)]

    def run(boundary):
        st = Contour(parse_spec(spec), trace, ["alpha", "depth"])
        run_in_process(st, lambda t, x: (x if x <= boundary[t] else math.nan, 1.0))
        return st, st.tables()[0]

    st, contour = run([1.0, 1.0, 1.0, 1.0])  # stable everywhere
    assert [len(v) for v in st.values] == [3, 1, 1, 1] and (contour["status"] == "unbracketed").all()
    st, contour = run([0.0, 0.0, 0.0, 0.0])  # stable nowhere
    assert [len(v) for v in st.values] == [3, 1, 1, 1] and (contour["status"] == "unbracketed").all()
    assert min(st.values[2]) == 3e-5
    st, contour = run([1.0, 1.0, 1e-3, 1e-3])  # α = 4 fails at the top: bisected like any cell
    c = contour.set_index(["alpha", "depth"])
    assert (c.loc["4", "status"] == "converged").all(), contour
    assert all(lo <= 1e-3 <= hi for lo, hi in zip(c.loc["4", "lo"], c.loc["4", "hi"], strict=True))


def test_a_rounds_read_back_asks_the_store_for_its_own_config_hashes_only(tmp_path, monkeypatch):
    """Issue 28 row 7: each round reads back its configs by hash (one indexed query each), not
    every run of the experiment; the newest FINISHED run of a hash gives its values."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from hydra_plugins.rankexp_plugins.contour import ContourSweeper
    from rankexp import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, "contour")
    c = MlflowClient(uri)
    for t, (h, m, status) in enumerate([("a", 0.3, "FINISHED"), ("a", 0.4, "FINISHED"),
                                        ("b", 0.9, "FAILED"), ("c", 1.0, "FINISHED")]):
        run = c.create_run(exp, start_time=1000 + t, tags={"config_hash": h}).info.run_id
        c.log_metric(run, "m", m)
        c.log_param(run, "nominal_ratio", m / 2)
        c.set_terminated(run, status)
    asked = []
    search = MlflowClient.search_runs
    monkeypatch.setattr(MlflowClient, "search_runs", lambda self, ids, filter_string="", *a, **k:
                        asked.append(filter_string) or search(self, ids, filter_string, *a, **k))
    sweeper = SimpleNamespace(spec=SimpleNamespace(metric="m"))
    got = ContourSweeper._read_back(sweeper, SimpleNamespace(uri=uri, experiment="contour",
                                                        experiment_id=exp), ["a", "b"])
    assert got[0] == (0.4, 0.2) and all(map(math.isnan, got[1]))
    assert asked and all("tags.config_hash = 'a'" in f or "tags.config_hash = 'b'" in f
                         for f in asked), asked
