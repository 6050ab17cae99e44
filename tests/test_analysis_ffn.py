"""``analysis ffn`` (Figure 12) end to end: a GPT-2 checkpoint the test saves with
``save_pretrained`` (and a word-level tokenizer it builds, offline) is loaded by
``model.pretrained`` — shape from its ``config.json``, its own weights, a text prompt by its
tokenizer — measured by the job into a real SQLite MLflow store beside a random-init run, and
drawn; the figure passes ``figure_checks`` and the logged numbers equal a direct computation.
"""

from __future__ import annotations

import pytest
import torch
from figure_checks import checked
from test_gpt2 import F64, composed, lm

from rankexp.config import validate
from rankexp.models import gpt2
from rankexp.probes.ffn import ffn_jacobians, ffn_statistics


def _tiny_tokenizer(path):
    """A word-level tokenizer saved beside the checkpoint (offline: built, not downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: 100 + i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = gpt2.transformers_module().PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.save_pretrained(path)
    return fast


def test_pretrained_path_through_the_job_tracking_and_analysis(tmp_path, monkeypatch):
    """A GPT-2 saved with save_pretrained, loaded by model.pretrained: shape from its config.json,
    its own weights (not a re-initialization), a text prompt by its tokenizer; the run lands in
    MLflow and ``analysis ffn`` draws it beside a random-init run."""
    from rankexp.app import run

    ckpt = tmp_path / "ckpt"
    saved = lm(32, 3, seeds=(11,)).members[0]
    with torch.no_grad():  # a "trained" network: weights no seed of the random path draws
        for p in saved.parameters():
            p.add_(0.01 * torch.randn_like(p))
    saved.save_pretrained(ckpt)
    tok = _tiny_tokenizer(ckpt)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["tracking.experiment=fig12", f"tracking.uri={uri}", "device=cpu"]
    results = {}
    for name, extra in (("trained", [f"model.pretrained={ckpt}", 'model.prompt="the quick brown fox"']),
                        ("init", ["width=32", "depth=3", "seeds=2"])):
        cfg = composed(*common, *extra)
        s = validate(cfg)
        if name == "trained":
            assert (s.width, s.depth, s.seeds) == (32, 3, 1)  # from the checkpoint's config.json
        results[name] = run(cfg)
        assert results[name]["status"] == "FINISHED"

    # the job measured the saved weights on the tokenized prompt
    loaded = lm(32, 3, pretrained=str(ckpt), prompt="the quick brown fox", tokenizer=None)
    assert loaded.prompt_ids.tolist() == [tok("the quick brown fox")["input_ids"]]
    assert torch.equal(loaded.members[0].transformer.h[2].mlp.c_proj.weight,
                       saved.transformer.h[2].mlp.c_proj.weight.to(F64))
    _, x = loaded.trace(0)
    want = ffn_statistics(ffn_jacobians(loaded, 0, x))
    got = results["trained"]["scalars"]
    assert got["ffn_cos_offdiag_mean"] == pytest.approx(float(want["cos_offdiag_mean"]), rel=1e-9)
    assert got["ffn_accumulated_ratio"] == pytest.approx(
        float(want["accumulated"][-1] / want["uncorrelated"][-1]), rel=1e-9)

    out = tmp_path / "figs"
    with checked(["ffn", "--uri", uri, "--out", str(out)]) as (rc, figs):
        assert rc == 0
        fig = figs["fig12_ffn_jacobians"]
        assert len(fig.axes) >= 8  # two rows of four panels (+ colour bars)
        labels = " ".join(ax.get_ylabel() for ax in fig.axes)
        assert "trained ckpt" in labels and "init" in labels
    table = (out / "fig12" / "ffn_summary.md").read_text()
    assert "trained ckpt" in table and "init" in table
