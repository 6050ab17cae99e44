"""``python -m analysis report [--uri …] [--out DIR]``: a reproduction report of a store.

Writes ``DIR/report.html`` (self-contained, figures as ``data:`` URIs: the claims table, then
per experiment what it shows, its config summary, figures, tables and claims),
``DIR/report.md`` (figures linked under ``DIR/figures/<experiment>/``), ``DIR/claims.csv`` and
the commands' logs under ``DIR/logs/``.  Everything comes from the registry
(:mod:`analysis.core.registry`); a failing command is noted in its section."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import html
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from rankexp.tracking import TrackingError, experiment_names, resolve_uri

from . import claims, style
from .registry import Registry, default
from .runner import Command, run_logged, set_experiment_default
from .runs import load_runs
from .select import CONFIG_KEYS

log = logging.getLogger("analysis")

#: params the config summary reports besides :data:`analysis.core.select.CONFIG_KEYS`
SUMMARY_KEYS = ("size", "task.name", "task.probes", "task.steps", "task.lrs", "model.name",
                *CONFIG_KEYS)
CSV_PREVIEW_ROWS = 12


@dataclass
class Section:
    """One experiment of the report."""

    experiment: str
    description: str = ""
    runs: int = 0
    failed: int = 0
    fixed: list[tuple[str, str]] = field(default_factory=list)
    swept: list[tuple[str, str]] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)  # (title, markdown)
    previews: list[tuple[Path, pd.DataFrame]] = field(default_factory=list)
    commands: list[tuple[str, int, str]] = field(default_factory=list)  # (argv, status, tail)
    verdicts: list[claims.Verdict] = field(default_factory=list)


# --------------------------------------------------------------------------- sections
def _fmt(v) -> str:
    return f"{float(v):g}" if isinstance(v, float | np.floating) else str(v)


def summarize(df: pd.DataFrame) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(fixed, swept)``: ``(param, value)`` of the summary params that take one value, and
    ``(param, values)`` of those that take several (the sweep's axes)."""
    fixed, swept = [], []
    for key in dict.fromkeys(SUMMARY_KEYS):
        values = style.values(df, key)
        if not values:
            continue
        if len(values) == 1:
            fixed.append((key, _fmt(values[0])))
        else:
            shown = ", ".join(_fmt(v) for v in values[:10])
            swept.append((key, shown + (f", … ({len(values)} values)" if len(values) > 10 else "")))
    return fixed, swept


def draw(section: Section, argvs: list[list[str]], uri: str, out: Path) -> None:
    """Run the experiment's analysis commands (``argvs``) on ``uri`` into ``out/figures``."""
    for argv in argvs:
        log_file = out / "logs" / f"{section.experiment}.log"
        rc, text, files = run_logged(argv, out / "figures", uri, log_file)
        tail = text.strip().splitlines()[-1][:300] if rc and text.strip() else ""
        section.commands.append((" ".join(argv), rc, tail))
        section.figures += [f for f in files if f.suffix == ".png"]
        stems = {f.stem for f in files if f.suffix == ".md"}
        for f in files:
            if f.suffix == ".md":
                lines = [line for line in f.read_text().splitlines() if line.startswith("|")]
                section.tables.append((f.stem.replace("_", " "), "\n".join(lines)))
            elif f.suffix == ".csv" and f.stem not in stems:
                try:
                    section.previews.append((f, pd.read_csv(f, nrows=CSV_PREVIEW_ROWS)))
                except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
                    continue


def build_sections(runs: claims.Runs, names: list[str], out: Path, with_figures: bool,
                   reg: Registry) -> list[Section]:
    sections = []
    for name in names:
        s = Section(name, reg[name].shows if name in reg else "")
        try:
            df = runs(name)
        except claims.NotRun:
            df = pd.DataFrame()
        s.runs = len(df)
        try:
            every = load_runs(name, runs.uri, finished_only=False)
            s.failed = int((every["status"] != "FINISHED").sum()) if len(every) else 0
        except TrackingError:
            pass
        if len(df):
            s.fixed, s.swept = summarize(df)
            if with_figures and name in reg:
                log.info("[report] %s: drawing", name)
                draw(s, reg[name].argvs(), runs.uri, out)
        sections.append(s)
    return sections


# --------------------------------------------------------------------------- rendering
def md_to_html(table: str) -> str:
    """A GitHub-Markdown table (as :func:`analysis.core.style.to_markdown` writes) as HTML."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.strip().startswith("|")]
    rows = [r for r in rows if not all(re.fullmatch(r":?-{3,}:?", c) for c in r)]
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in rows[1:])
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_html(sections: list[Section], verdicts, meta: dict) -> str:
    template = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("analysis.core").joinpath(name).read_text()),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined).get_template("report.html.j2")

    def png(p: Path) -> str:
        return "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode()

    rows = [{"s": s, "figures": [(p.stem, png(p)) for p in s.figures],
             "tables": [(t, Markup(md_to_html(md))) for t, md in s.tables],
             "previews": [(p.name, Markup(d.to_html(index=False, float_format=lambda v: f"{v:.4g}",
                                                    classes="data", border=0)))
                          for p, d in s.previews],
             "claims": [v.row() for v in s.verdicts]} for s in sections]
    return template.render(meta=meta, claims=[v.row() for v in verdicts], summary=summary(verdicts),
                           sections=rows)


def summary(verdicts: list[claims.Verdict]) -> str:
    """``3 hold, 1 inconclusive, 0 do not hold, 5 not judged at this size, 2 not run``."""
    n = {k: sum(v.verdict == k for v in verdicts) for k in claims.VERDICTS}
    parts = [f"{n[claims.HOLDS]} hold",
             *([f"{n[claims.PRINTED]} where the source's printed value differs"]
               if n[claims.PRINTED] else []), f"{n[claims.INCONCLUSIVE]} inconclusive",
             f"{n[claims.FAILS]} do not hold", f"{n[claims.NOT_JUDGED]} not judged at this size",
             f"{n[claims.NOT_RUN]} not run"]
    return ", ".join(parts + ([f"{n[claims.ERROR]} errors"] if n[claims.ERROR] else []))


def _md_claims(verdicts) -> str:
    t = claims.table(verdicts)
    if t.empty:
        return "(no claims registered)"
    cols = ["claim", "experiment", "study", "measured", "tolerance", "verdict", "size", "valid_from",
            "d", "L", "note"]
    t = t.assign(claim=t["id"] + ": " + t["claim"])[cols]
    return style.to_markdown(t.map(lambda v: str(v).replace("|", "\\|")))


def render_markdown(sections: list[Section], verdicts, meta: dict, out: Path) -> str:
    lines = [f"# {meta['title']}", "",
             f"Store `{meta['uri']}` · {meta['runs']} finished runs in {len(sections)} experiments"
             f" · sizes: {meta['sizes']} · written {meta['when']} · commit {meta['commit']}", "",
             "## Claims", "", summary(verdicts) + ".", "", _md_claims(verdicts), ""]
    for s in sections:
        lines += [f"## {s.experiment}", ""]
        if s.description:
            lines += [s.description, ""]
        lines += [f"{s.runs} finished runs" + (f", {s.failed} not finished" if s.failed else ""), ""]
        if s.swept:
            lines += ["Swept: " + "; ".join(f"`{k}` ∈ {{{v}}}" for k, v in s.swept), ""]
        if s.fixed:
            lines += ["Fixed: " + ", ".join(f"`{k}` = {v}" for k, v in s.fixed), ""]
        for argv, rc, tail in s.commands:
            if rc:
                lines += [f"> `python -m analysis {argv}` failed ({rc}): {tail}", ""]
        for p in s.figures:
            lines += [f"![{p.stem}]({p.relative_to(out).as_posix()})", ""]
        for title, md in s.tables:
            lines += [f"**{title}**", "", md, ""]
        for p, _ in s.previews:
            lines += [f"Table: [{p.name}]({p.relative_to(out).as_posix()})", ""]
        if s.verdicts:
            lines += ["Claims:", "", _md_claims(s.verdicts), ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- entry point
def build_report(uri: str | None, out: Path, experiments: list[str] | None = None,
                 with_figures: bool = True, title: str = "rankexp reproduction report",
                 registry: Registry | None = None) -> list[Path]:
    """Write ``out/report.html``, ``out/report.md`` and ``out/claims.csv`` from ``registry``
    (default :func:`analysis.core.registry.default`); return the paths.  Raises TrackingError:
    the store cannot be read or holds none of ``experiments``."""
    reg = registry or default()
    uri = resolve_uri(uri)
    present = experiment_names(uri)
    wanted = experiments or present  # the registry's in document order, then the others by name
    names = [e for e in reg.ids() if e in wanted] + sorted(set(wanted) - set(reg.ids()))
    missing = [e for e in names if e not in present]
    if experiments and len(missing) == len(names):
        raise TrackingError(f"the store {uri} holds none of {experiments}; it has: {present}")
    out.mkdir(parents=True, exist_ok=True)
    runs = claims.Runs(uri)
    try:
        sections = build_sections(runs, names, out, with_figures, reg)
        verdicts = claims.evaluate(runs, reg.claims())
    finally:
        runs.close()
    by_exp = {s.experiment: s for s in sections}
    for v in verdicts:
        if v.claim.experiment in by_exp:
            by_exp[v.claim.experiment].verdicts.append(v)
    frames = [f for name, f in runs.loaded().items() if name in by_exp]
    every = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def distinct(key: str, absent: str, n: int | None = None) -> str:
        if key not in every:
            return absent
        return ", ".join(sorted(every[key].dropna().astype(str).str[:n].unique()))

    meta = {"title": title, "uri": uri, "runs": sum(s.runs for s in sections),
            "sizes": distinct("size", "full"), "commit": distinct("tags.git_commit", "—", 10),
            "when": dt.datetime.now().strftime("%Y-%m-%d %H:%M")}
    paths = [out / "report.html", out / "report.md", out / "claims.csv"]
    paths[0].write_text(render_html(sections, verdicts, meta))
    paths[1].write_text(render_markdown(sections, verdicts, meta, out))
    claims.table(verdicts).to_csv(paths[2], index=False)
    log.info("claims: %s", summary(verdicts))
    for p in paths:
        log.info("wrote %s", p)
    return paths


def _arguments(p: argparse.ArgumentParser) -> None:
    set_experiment_default(p, None, "experiments to report (default: every one in the store)")
    for action in p._actions:
        if action.dest == "out":
            action.default, action.help = "report", "output folder (default: report/)"
    p.add_argument("--no-figures", action="store_true",
                   help="skip the analysis commands: claims and config summaries only")
    p.add_argument("--title", default="rankexp reproduction report", help="the page's title")


def _main(args: argparse.Namespace) -> list[Path]:
    if args.filter:
        raise KeyError("report reads every run of the store; --filter is not supported")
    return build_report(args.uri, Path(args.out), args.experiment, not args.no_figures, args.title)


COMMANDS = {
    "report": Command(_main, "reproduction report: every experiment's figures, tables, config "
                             "and the study's claims checked (HTML + Markdown)",
                             None, False, _arguments)}
