"""The analysis command line (issue 19 item 6): one naming style for its commands, the old
names as aliases, and the ``rankexp-analysis`` console script declared and documented."""

from __future__ import annotations

from pathlib import Path

import tomllib

from analysis.core import runner

ROOT = Path(__file__).resolve().parent.parent


def test_every_command_has_one_hyphenated_name_and_its_old_name_as_an_alias():
    p = runner.parser()
    sub = next(a for a in p._actions if a.dest == "command")
    for name, command in runner.commands().items():
        canonical = name.replace("_", "-")
        for typed in {canonical, name}:
            args = p.parse_args([typed, "--experiment", "x"])
            assert args.run is command.main, typed
    listed = [a.dest for a in sub._choices_actions]
    assert listed and all("_" not in n for n in listed), listed  # --help shows one style
    assert "mf-phase" in listed and "init-gradients" in listed


def test_the_console_script_is_declared_runs_main_and_is_documented():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["rankexp-analysis"].split(":")
    assert (module, func) == ("analysis.core.runner", "cli")
    assert callable(runner.cli)
    assert "rankexp-analysis" in (ROOT / "README.md").read_text()
