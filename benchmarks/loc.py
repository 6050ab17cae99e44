"""Product lines of rankexp: every text file under :data:`FOLDERS`, per folder and in total.

    python -m benchmarks.loc                  # the working tree (tracked and untracked, not ignored)
    python -m benchmarks.loc --at cd9a9b7     # and that commit beside it, read through git

A line is a line of ``str.splitlines`` (``wc -l`` plus an unterminated last line); a counted
file is any file without a NUL byte in it (``.py``, ``.sh``, ``.c``, ``.j2`` …) except the
documentation (``.md``); ``conf/`` and ``tests/`` are not product lines.  Another commit is
read with ``git archive`` (nothing is checked out).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("rankexp", "analysis", "hydra_plugins", "benchmarks", "launchers")


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def count(files: dict[str, bytes]) -> tuple[Counter, Counter]:
    """(lines, files) per top-level folder of ``{path: content}``, text files but documentation."""
    n, f = Counter(), Counter()
    for path, data in files.items():
        if b"\0" not in data and not path.endswith(".md"):
            k = len(data.decode("utf-8", "replace").splitlines())
            top = path.split("/", 1)[0]
            n[top] += k
            f[top] += 1
    return n, f


def working_tree() -> dict[str, bytes]:
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *FOLDERS)
    paths = sorted({p for p in names.decode().split("\0") if p})
    return {p: (ROOT / p).read_bytes() for p in paths if (ROOT / p).is_file()}


def at(rev: str) -> dict[str, bytes]:
    """``{path: content}`` of ``rev``'s files under :data:`FOLDERS` (one ``git archive``)."""
    with tarfile.open(fileobj=io.BytesIO(git("archive", rev, "--", *FOLDERS))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--at", action="append", default=[], metavar="REV",
                   help="also count this commit (repeatable), printed before the working tree")
    args = p.parse_args(argv)
    columns = {}
    for rev in args.at:
        short = git("rev-parse", "--short", rev).decode().strip()
        columns[f"{rev} ({short})" if short != rev else rev] = count(at(rev))
    columns["working tree"] = count(working_tree())
    width = max(len(c) for c in columns) + 2
    print("product lines".ljust(16) + "".join(c.rjust(width) for c in columns))
    for folder in FOLDERS:
        print(folder.ljust(16) + "".join(f"{n[folder]:,}".rjust(width) for n, _ in columns.values()))
    print("total".ljust(16) + "".join(f"{sum(n.values()):,}".rjust(width) for n, _ in columns.values()))
    print("files".ljust(16) + "".join(f"{sum(f.values()):,}".rjust(width) for _, f in columns.values()))


if __name__ == "__main__":
    main()
