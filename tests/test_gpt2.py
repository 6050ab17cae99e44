"""``model=gpt2`` (Figure 12): Hugging Face causal LMs and their FFN-branch Jacobians.

Truths checked: the closed form ``W_projᵀ diag(gelu′) W_fcᵀ J_ln`` equals ``torch.func`` on the
modules (also at a non-trivial LayerNorm gain/shift, as in trained weights); the Llama family's
``torch.func`` path equals its own closed form ``W_down [diag(silu′(g)⊙u) W_gate + diag(silu(g))
W_up] J_rms`` written out here; the statistics equal their definitions (Gram identities); at
GPT-2's initialization the cosines are within a few × 1/d of 0 and the Jacobians add as
uncorrelated terms (the study: "every assumption holds exactly at initialization"); the
pretrained path loads what a test saved with ``save_pretrained`` (end to end through the job,
MLflow and ``analysis ffn``: ``test_analysis_ffn.py``).  ``transformers`` is imported only by ``model=gpt2``.
The test set-up installs the ``gpt2`` extra (``make setup``: ``.[test,gpt2]``); without it
these fail rather than skip.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir

from rankexp.cli import CONF_DIR
from rankexp.config import ConfigError, validate
from rankexp.models import gpt2
from rankexp.models.gpt2 import DEFAULT_PROMPT_IDS, build_causal_lm
from rankexp.probes.ffn import (
    ffn_jacobian_autograd,
    ffn_jacobians,
    ffn_statistics,
    gpt2_ffn_jacobian,
)

F64 = torch.float64


def lm(width=64, depth=4, seeds=(0,), **kw):
    args = dict(config="gpt2", pretrained=None, width=width, depth=depth, heads=None, seeds=seeds,
                prompt_ids=DEFAULT_PROMPT_IDS, prompt=None, tokenizer=None, position=-1,
                dtype=F64, device="cpu")
    return build_causal_lm(**{**args, **kw})


def relative(a, b) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.fixture(scope="module")
def small():
    return lm(64, 4, seeds=(0, 1))


# --------------------------------------------------------------------------- Jacobians
def test_closed_form_ffn_jacobians_equal_autograd(small):
    for e in range(2):
        _, x = small.trace(e)
        closed = ffn_jacobians(small, e, x)
        auto = torch.stack([ffn_jacobian_autograd(small, e, l, x[l - 1]) for l in range(1, 5)])
        assert relative(closed, auto) < 1e-12


def test_closed_form_at_a_trained_like_layernorm_and_bias():
    """GPT-2's init has γ = 1, shift 0, b_fc = 0; trained weights do not: perturb them all."""
    net = lm(48, 2)
    norm, mlp = net.ffn_parts(0, 2)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(48, generator=g, dtype=F64))
        norm.bias.copy_(0.3 * torch.randn(48, generator=g, dtype=F64))
        mlp.c_fc.bias.copy_(0.5 * torch.randn(mlp.c_fc.bias.shape, generator=g, dtype=F64))
    x = 3 * torch.randn(48, generator=g, dtype=F64) + 1.5  # off-centre, not unit scale
    auto = ffn_jacobian_autograd(net, 0, 2, x)
    assert relative(gpt2_ffn_jacobian(norm, mlp, x, "gelu_new"), auto) < 1e-12
    # the exact-erf GELU closed form against its module
    mlp.act = torch.nn.GELU()
    assert relative(gpt2_ffn_jacobian(norm, mlp, x, "gelu"), ffn_jacobian_autograd(net, 0, 2, x)) < 1e-12


def test_statistics_are_their_definitions(small):
    _, x = small.trace(0)
    jac = ffn_jacobians(small, 0, x)
    s = ffn_statistics(jac, first_block=2)
    d = jac.shape[-1]
    norms = jac.flatten(1).norm(dim=1)
    assert torch.allclose(s["ratio"], norms / math.sqrt(d))
    for i in range(4):
        for j in range(4):
            want = (jac[i] * jac[j]).sum() / (norms[i] * norms[j])
            assert torch.allclose(s["cosines"][i, j], want)
    for k in range(2, 5):  # the sums over blocks 2…k, formed explicitly
        block = jac[1:k]
        assert torch.allclose(s["accumulated"][k - 2], block.sum(0).norm() / math.sqrt(d))
        assert torch.allclose(s["uncorrelated"][k - 2], block.flatten(1).norm() / math.sqrt(d))
        assert torch.allclose(s["coherent"][k - 2], norms[1:k].sum() / math.sqrt(d))
    with pytest.raises(ValueError, match="first_block"):
        ffn_statistics(jac, first_block=5)


def test_trace_is_the_stream_the_model_computes(small):
    """h_L from the hooks is the last block's output: ln_f of it is HF's last hidden state."""
    stream, ffn_in = small.trace(0)
    model = small.members[0]
    with torch.no_grad():
        out = model(input_ids=small.prompt_ids, output_hidden_states=True)
    assert torch.allclose(out.hidden_states[0][0, -1], stream[0])
    assert torch.allclose(model.transformer.ln_f(stream[-1]), out.hidden_states[-1][0, -1])
    # x_l = h_{l-1} + attention branch: the FFN branch then completes the block
    block = model.transformer.h[1]
    with torch.no_grad():
        assert torch.allclose(ffn_in[1] + block.mlp(block.ln_2(ffn_in[1])), stream[2])


def test_members_are_their_seeds():
    both, one = lm(32, 2, seeds=(3, 4)), lm(32, 2, seeds=(4,))
    assert torch.equal(both.members[1].transformer.h[0].mlp.c_fc.weight,
                       one.members[0].transformer.h[0].mlp.c_fc.weight)
    assert not torch.equal(both.members[0].transformer.h[0].mlp.c_fc.weight,
                           both.members[1].transformer.h[0].mlp.c_fc.weight)


# --------------------------------------------------------------------------- the study at init
def _init_claims(net, d):
    for e in range(len(net.members)):
        _, x = net.trace(e)
        s = ffn_statistics(ffn_jacobians(net, e, x))
        off = s["cosines"][1:, 1:][~torch.eye(net.depth - 1, dtype=torch.bool)]
        assert off.abs().max() < 5 / d, (e, off.abs().max() * d)
        assert 0.3 / d < s["cos_offdiag_rms"] < 3 / d
        assert abs(float(s["accumulated"][-1] / s["uncorrelated"][-1]) - 1) < 0.05
        # not trivially: the coherent ceiling is far above, √(L−1)-like
        assert s["coherent"][-1] / s["uncorrelated"][-1] > 0.8 * math.sqrt(net.depth - 1)


def test_at_init_cosines_are_of_order_one_over_d_and_blocks_add_uncorrelated():
    _init_claims(lm(128, 6, seeds=(0, 1)), 128)


@pytest.mark.slow
def test_gpt2_small_at_init_full_size():
    net = lm(768, 12, seeds=(0,))
    _, x = net.trace(0)
    closed = ffn_jacobians(net, 0, x)
    for l in (1, 6, 12):
        assert relative(closed[l - 1], ffn_jacobian_autograd(net, 0, l, x[l - 1])) < 1e-12
    _init_claims(net, 768)


# --------------------------------------------------------------------------- other architectures
def test_llama_family_torch_func_path_equals_its_closed_form(tmp_path):
    tf = gpt2.transformers_module()
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=32000)
    torch.manual_seed(0)
    tf.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    net = build_causal_lm(**{**dict(config="gpt2", heads=None, seeds=(0,), prompt_ids=DEFAULT_PROMPT_IDS,
                                    prompt=None, tokenizer=None, position=3, dtype=F64, device="cpu"),
                             "pretrained": str(tmp_path), "width": 32, "depth": 2})
    assert net.model_type == "llama"
    _, x = net.trace(0)
    jac = ffn_jacobians(net, 0, x)
    for l in (1, 2):
        norm, mlp = net.ffn_parts(0, l)
        xl = x[l - 1]
        r = torch.sqrt(xl.pow(2).mean() + norm.variance_epsilon)
        j_rms = norm.weight[:, None] * (torch.eye(32, dtype=F64) / r - torch.outer(xl, xl) / (32 * r**3))
        y = norm(xl)
        g, u = mlp.gate_proj.weight @ y, mlp.up_proj.weight @ y
        sig = torch.sigmoid(g)
        silu, dsilu = g * sig, sig * (1 + g * (1 - sig))
        inner = (dsilu * u)[:, None] * mlp.gate_proj.weight + silu[:, None] * mlp.up_proj.weight
        want = mlp.down_proj.weight @ inner @ j_rms
        # LlamaRMSNorm normalizes in float32 whatever the weights' dtype: float32 agreement
        assert relative(jac[l - 1], want.detach()) < 1e-6


# --------------------------------------------------------------------------- configs
def composed(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", ["model=gpt2", *overrides])


def test_config_shapes_and_defaults():
    s = validate(composed())
    assert (s.width, s.depth, s.seeds, s.task.probes) == (768, 12, 1, ["ffn_jacobian"])
    s = validate(composed("model.config=gpt2-medium"))
    assert (s.width, s.depth) == (1024, 24)
    s = validate(composed("width=64", "depth=3"))
    assert (s.width, s.depth) == (64, 3)
    assert gpt2.default_heads(64, "gpt2") == 1 and gpt2.default_heads(768, "gpt2") == 12
    assert gpt2.default_heads(1024, "gpt2") == 16 and gpt2.default_heads(96, "gpt2") == 1
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        mlp = validate(compose("config", []))
    assert mlp.task.probes == ["io_jacobian", "profile", "stream", "branch_ratio"]
    assert (mlp.width, mlp.depth) == (256, 48)


@pytest.mark.parametrize("overrides, message", [
    (["task=train"], "does not train"),
    (["task.probes=[io_jacobian]"], "model=gpt2 runs"),
    (["model.config=gpt3"], "model.config"),
    (["model.prompt=hello"], "needs a tokenizer"),
    (["model.position=10"], "outside the prompt"),
    (["model.n_head=5", "width=64"], "must divide"),
    (["model.pretrained=gpt2", "seeds=2"], "seeds=1"),
])
def test_bad_gpt2_configs_fail_before_any_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(composed(*overrides))


def test_gpt2_probe_needs_the_gpt2_family():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", ["task.probes=[ffn_jacobian]"])
    with pytest.raises(ConfigError, match="model=gpt2"):
        validate(cfg)


def test_unknown_hub_id_shape_is_a_clear_error():
    with pytest.raises(ConfigError, match="not known offline"):
        validate(composed("model.pretrained=someone/some-model"))


def test_transformers_is_imported_only_by_model_gpt2():
    code = ("import sys, rankexp.app, rankexp.tasks, rankexp.probes, rankexp.config\n"
            "import analysis.core.runner as runner; runner.commands()  # every analysis command\n"
            "assert 'transformers' not in sys.modules, 'imported transformers'\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"\.\[gpt2\]"):
        gpt2.transformers_module()
