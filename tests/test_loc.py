"""`make loc`: another commit's files are read through git exactly, and a line is a line of
every text file but the documentation."""

from __future__ import annotations

import subprocess

from benchmarks import loc


def test_a_commit_is_read_through_git_byte_for_byte():
    files = loc.at("HEAD")
    assert files and all(p.split("/", 1)[0] in loc.FOLDERS for p in files)
    for path in sorted(files)[:: max(1, len(files) // 5)]:
        shown = subprocess.run(["git", "-C", str(loc.ROOT), "show", f"HEAD:{path}"], capture_output=True,
                               check=True).stdout
        assert files[path] == shown


def test_text_files_count_binary_and_docs_do_not():
    lines, files = loc.count({"rankexp/a.py": b"x\ny", "launchers/b.sh": b"\n\n\n", "launchers/c.md": b"1\n2\n",
                              "analysis/d.png": b"\x89PNG\0\1\n"})
    assert lines == {"rankexp": 2, "launchers": 3} and files == {"rankexp": 1, "launchers": 1}
