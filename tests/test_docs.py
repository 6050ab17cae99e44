"""The documentation: the README is a page, and the site under docs/ builds with warnings as
errors (``mkdocs build --strict``), its knob, probe and experiment tables generated from the
registries, and nothing in it points users at notes they do not have."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_page_whose_links_lead_somewhere():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for command in ("make demo", "make test", "experiment=fig6 hydra/launcher=slurm -m", "mlflow ui",
                    "python -m analysis heatmap", "task=train"):
        assert command in text, command
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links and all((ROOT / link).exists() for link in links), links


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def test_the_tables_are_generated_from_the_registries(site):
    from analysis.core.registry import default
    from rankexp.knobs import KNOBS
    from rankexp.probes import PROBES

    configuration, probes, experiments = (page(site, p) for p in ("configuration", "probes", "experiments"))
    assert "<!-- table" not in configuration + probes + experiments
    for knob in KNOBS:
        assert f"<code>{knob.key}</code>" in configuration, knob.key
    for name in PROBES:
        assert f"<code>{name}</code>" in probes, name
    for experiment in default():
        assert f"<code>{experiment.id}</code>" in experiments, experiment.id
    assert "<code>hydra/launcher=slurm</code>" in configuration


def test_the_api_pages_document_the_public_names(site):
    api = page(site, "api")
    for name in ("rankexp.analyze", "rankexp.SpectralMonitor", "rankexp.spectra.erank",
                 "rankexp.theory.activation_constants"):
        assert f'id="{name}"' in api, name


def test_the_site_never_points_at_notes_users_do_not_have(site):
    """Users never see the study's notes: the site cites the study's equations, not a file."""
    found = sorted({f"{p.relative_to(site)}: {m}" for p in site.rglob("*.html")
                    for m in re.findall(r"science\.md[^<]{0,24}|\.\./shared\S{0,24}", p.read_text())})
    assert not found, found
