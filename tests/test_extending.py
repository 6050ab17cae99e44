"""docs/extending.md's worked example, performed as written: in a copy of the repository its
five steps (a probe, its registration, its experiment, its figure + claim + registry entry, its
test) are applied from the document's own code blocks, and then — with nothing else touched —
the new test passes, the registry lists the new experiment and its command, the every-experiment
test sweeps it at smoke size, draws it and decides its claim (and the example's own test shows
the claim failing on runs whose mean is not 1)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from services import clean_env

DOC = REPO / "docs" / "extending.md"
BLOCK = re.compile(r'^```\w+ file=(\S+)(?: after="([^"\n]*)")?\n(.*?)^```', re.M | re.S)


def blocks() -> list[tuple[str, str | None, str]]:
    """``(path, anchor line or None, text)`` of every code block of the document with a file."""
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(DOC.read_text())]


def copy_of_repository(dst: Path) -> Path:
    """The files git tracks (and untracked ones it does not ignore), as they are now."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split()
    for rel in listed:
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def apply(root: Path) -> set[str]:
    """Write the document's blocks into ``root``; returns the files touched."""
    touched = set()
    for rel, anchor, text in blocks():
        path = root / rel
        if anchor is None:
            assert not path.exists(), f"{rel}: the example writes a new file, one exists"
            path.write_text(text)
        else:
            lines = path.read_text().split("\n")
            assert lines.count(anchor) == 1, f"{rel}: anchor {anchor!r} is not one line of the file"
            i = lines.index(anchor) + 1
            path.write_text("\n".join(lines[:i] + text.rstrip("\n").split("\n") + lines[i:]))
        touched.add(rel)
    return touched


def run(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=str(root))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_worked_example_takes_five_files_and_runs(tmp_path):
    root = copy_of_repository(tmp_path / "repo")
    touched = apply(root)
    assert touched == {"rankexp/probes/trace.py", "rankexp/probes/__init__.py",
                       "conf/experiment/io_trace.yaml", "analysis/study/io_trace.py",
                       "tests/test_io_trace.py"}  # five files, nothing else
    p = run(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
            "tests/test_io_trace.py", "tests/test_analysis_experiments.py",  # docs/extending.md's
            "-k", "(io_trace and not cpu_size) or registry_is_the_list")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "7 passed" in p.stdout, p.stdout[-2000:]  # 5 of its test, its smoke case, the registry
    listed = run(root, "-c", "from analysis.core.registry import default; from analysis.core.runner "
                 "import commands; e = default()['io_trace']; print(e.part, e.analyses, 'io_trace' "
                 "in commands())")
    assert listed.stdout.split() == ["study", "('io_trace", "--experiment", "io_trace',)", "True"], listed
