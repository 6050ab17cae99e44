"""``rankexp.analyze``: the study's instruments on any network, one row per block.

Truths checked: on rankexp's MLP the frame equals the ``profile`` / ``io_jacobian`` /
``branch_ratio`` / ``stream`` / ``representation`` probes to 1e-10 (float64), through the
engine's closed form and through the independent ``torch.func`` path; on GPT-2 the FFN branch
ratio equals the ``ffn_jacobian`` probe's closed form, and the per-token prefix Jacobian equals
reverse-mode autodiff through the whole model from its input embeddings; on a custom block the
dense Jacobians equal ``torch.func.jacrev`` and the closed form ``I + W₂ diag(tanh′) W₁``; the
prefix restarts where the chain of blocks breaks (ResNet stages); an ensemble's member e equals
the one-member network of its seed; matrix-free estimates lie within their stated errors of the
exact values; bad input (no blocks, a block that changes shape, one called twice, sizes above
the bounds) fails with a clear error; the model is left as it was (flags, hooks, RNG, grads).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rankexp
from rankexp.instruments import BlockError, BlockSpec, MatrixFree, SizeError, analyze
from rankexp.models.convnet import CifarResNet
from rankexp.models.gpt2 import DEFAULT_PROMPT_IDS, build_causal_lm
from rankexp.models.mlp import ResidualMLP
from rankexp.models.plain import PlainNet
from rankexp.probes import PROBES, ProbeContext
from rankexp.probes.ffn import ffn_jacobians
from rankexp.seeding import gaussian_input
from rankexp.spectra import erank, stable_rank

F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def assert_close(a, b, tol=1e-10):
    a, b = (v.detach().to(F64) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=F64)
            for v in (a, b))
    assert torch.allclose(a, b, rtol=tol, atol=tol), float((a - b).abs().max())


def per_member(frame, column, members):
    return torch.tensor(frame.sort_values(["member", "block"])[column].to_numpy()).reshape(members, -1)


# --------------------------------------------------------------------------- rankexp's MLP = the probes
@pytest.fixture(scope="module")
def mlp():
    return ResidualMLP(24, 5, expansion=2, placement="post", alpha=1.5, seeds=(3, 4))


@pytest.mark.parametrize("method", ["closed_form", "dense"])
def test_mlp_equals_the_probes(mlp, method):
    n = 12
    frame = analyze(mlp, n, method=method)
    assert len(frame) == 2 * 5 and set(frame["method"]) == {method}
    ctx = ProbeContext(mlp, gaussian_input(mlp.seeds, 24), {"stream": {"inputs": n},
                                                               "representation": {"n": n}})
    m = {}
    for name in ("profile", "io_jacobian", "branch_ratio", "stream", "representation"):
        m.update(PROBES[name](ctx).arrays)
    assert_close(per_member(frame, "prefix_erank", 2), m["erank_profile"])
    assert_close(per_member(frame, "prefix_stable_rank", 2), m["stable_rank_profile"])
    assert_close(per_member(frame, "prefix_log_gain", 2), m["log_gain_profile"])
    assert_close(per_member(frame, "prefix_erank", 2)[:, -1], m["erank_io"])
    assert_close(per_member(frame, "branch_ratio", 2), m["branch_ratio"])
    assert_close(per_member(frame, "rms", 2), m["rms"][:, 1:])
    assert_close(per_member(frame, "representation_erank", 2), m["rep_erank"][:, 1:])
    assert (frame.filter(like="_err") == 0).all().all()


def test_mlp_branch_spectra_equal_autograd(mlp):
    from rankexp.probes.jacobian import branch_jacobian

    frame = analyze(mlp, 4, probes=["branch"])
    hs = mlp.trajectory(gaussian_input(mlp.seeds, 24))
    for l, block in enumerate(mlp.blocks, start=1):
        jb = branch_jacobian(block, hs[l - 1])  # torch.func oracle of J_b = β J_B J_f J_P
        rows = frame[frame["block"] == l].sort_values("member")
        assert_close(rows["branch_erank"].to_numpy(), erank(jb) / 24)
        assert_close(rows["branch_stable_rank"].to_numpy(), stable_rank(jb))
    assert not any(c.startswith(("prefix", "representation")) for c in frame.columns)


def test_mlp_matrix_free_within_stated_error(mlp):
    exact = analyze(mlp, 4)
    est = analyze(mlp, 4, method="matrix_free", matrix_free=MatrixFree(vectors=16, seed=1))
    assert set(est["method"]) == {"matrix_free"}
    for col in ("branch_erank", "branch_stable_rank", "branch_ratio", "prefix_erank",
                "prefix_stable_rank", "prefix_log_gain"):
        z = (est[col] - exact[col]).abs() / est[f"{col}_err"]
        assert (est[f"{col}_err"] > 0).all() and z.max() < 4.5, (col, float(z.max()))


def test_mlp_ensemble_member_is_its_seed():
    two = ResidualMLP(16, 3, seeds=(0, 5))
    one = ResidualMLP(16, 3, seeds=(5,))
    h = gaussian_input([0, 5], 16, batch=3)
    a = analyze(two, h, method="dense").query("member == 1").reset_index(drop=True)
    b = analyze(one, h[1:], method="dense")
    num = [c for c in a.columns if a[c].dtype.kind == "f"]
    assert_close(a[num].to_numpy(), b[num].to_numpy(), 1e-12)


def test_spaced_skips_closed_form_only():
    m = ResidualMLP(16, 8, skip_every=4)
    assert len(analyze(m, 2)) == 8
    with pytest.raises(BlockError, match="skip_every=4"):
        analyze(m, 2, method="dense")


def test_plain_net_layer_jacobian():
    net = PlainNet(20, 3, activation="tanh", alpha=1.3, bias=0.2, seeds=(1,))
    frame = analyze(net, 5, method="dense")
    h = net.trajectory(gaussian_input([1], 20))  # inputs=n: the Jacobians at task=measure's h_0
    for l, layer in enumerate(net.blocks, start=1):
        x = h[l - 1][0, 0]
        j = layer.w[0] * (1 - torch.tanh(x) ** 2)  # W diag(φ′(x)) (no norm, no skip)
        assert_close(frame["branch_ratio"][l - 1], j.norm() / math.sqrt(20))
        assert frame["branch_kind"][l - 1] == "block(h)"


# --------------------------------------------------------------------------- custom blocks vs autograd
class Residual(nn.Module):
    def __init__(self, d, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = nn.Parameter(torch.randn(2 * d, d, generator=g, dtype=F64) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(d, 2 * d, generator=g, dtype=F64) / math.sqrt(2 * d))

    def forward(self, x):
        return x + torch.tanh(x @ self.w1.T) @ self.w2.T


def test_custom_blocks_equal_jacrev_and_closed_form():
    d = 12
    net = nn.Sequential(nn.Linear(5, d, dtype=F64), Residual(d, 0), Residual(d, 1), nn.Tanh())
    x = torch.randn(3, 5, dtype=F64)
    frame = analyze(net, x, blocks=["1", "2"], point=1)
    assert list(frame["name"]) == ["1", "2"] and list(frame["stage"]) == [1, 1]
    h0 = net[0](x)[1]
    f = lambda v: net[2](net[1](v))  # noqa: E731
    prefix = torch.func.jacrev(f)(h0)
    assert_close(frame["prefix_erank"][1], erank(prefix) / d)
    assert_close(frame["prefix_stable_rank"][1], stable_rank(prefix))
    assert_close(frame["prefix_log_gain"][1], prefix.norm().log())
    blk = net[1]
    jf = blk.w2 @ ((1 - torch.tanh(blk.w1 @ h0) ** 2)[:, None] * blk.w1)  # closed form of ∂f/∂h
    assert_close(torch.func.jacrev(blk)(h0), torch.eye(d, dtype=F64) + jf, 1e-12)
    assert_close(frame["branch_ratio"][0], jf.norm() / math.sqrt(d))
    assert_close(frame["branch_erank"][0], erank(jf) / d)
    assert frame["branch_kind"][0] == "block(h) − h"


def test_block_spec_with_its_own_branch():
    d = 10
    blk = Residual(d, 2)
    net = nn.Sequential(blk)
    x = torch.randn(2, d, dtype=F64)
    spec = BlockSpec(blk, "ffn", branch=lambda y: torch.tanh(y @ blk.w1.T) @ blk.w2.T)
    a = analyze(net, x, blocks=[spec])
    b = analyze(net, x, blocks=[blk])
    assert a["name"][0] == "ffn" and a["branch_kind"][0] == "user"
    assert_close(a["branch_erank"], b["branch_erank"])  # f given = block − identity


# --------------------------------------------------------------------------- Hugging Face causal LMs
def test_llama_one_row_per_block_and_prefix_equals_autograd():
    tf = quiet_transformers()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    model = tf.LlamaForCausalLM(cfg).to(F64)
    ids = torch.randint(0, 101, (2, 6))
    frame = analyze(model, ids, point=1)
    assert list(frame["name"]) == [f"model.layers.{i}" for i in range(3)]
    assert set(frame["dim"]) == {32} and set(frame["stage"]) == {1}
    assert frame["branch_kind"][0] == "ffn: mlp(post_attention_layernorm(x))"
    assert (frame["rows"] == 12).all()  # every token of every input
    emb = model.model.embed_tokens(ids)

    def stream(e, l):  # h_l at the last token of input 1, from its embedding
        out = model(inputs_embeds=torch.cat([emb[:, :-1], torch.stack([emb[0, -1], e])[:, None]], 1),
                    output_hidden_states=True, use_cache=False)
        return out.hidden_states[l][1, -1]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        for l in (1, 2):  # hidden_states[3] is after the final norm
            j = torch.func.jacrev(lambda e, l=l: stream(e, l))(emb[1, -1])
            # Llama's RMSNorm computes in float32 even in a float64 model
            assert_close(frame["prefix_erank"][l - 1], erank(j) / 32, 1e-5)
            assert_close(frame["prefix_log_gain"][l - 1], j.norm().log(), 1e-5)


def test_representation_only_and_padding_masks():
    tf = quiet_transformers()
    torch.manual_seed(1)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=60, n_positions=8))
    ids = torch.randint(0, 60, (3, 5))
    frame = analyze(model, ids, probes="representation")
    assert set(frame["method"]) == {"forward"}
    assert list(frame.columns) == ["block", "name", "member", "stage", "dim", "method", "branch_kind",
                                   "representation_erank", "rms", "rows"]
    model.eval()  # analyze measures in eval mode (dropout off)
    h = model(ids, output_hidden_states=True).hidden_states[1].detach().reshape(15, 16)
    assert_close(frame["representation_erank"][0], erank(h.double()) / 16, 1e-6)  # float32 model
    assert_close(frame["rms"][0], h.double().square().mean().sqrt(), 1e-6)
    assert set(analyze(ResidualMLP(8, 2), 4, probes=["stream"])["method"]) == {"forward"}
    # a padding mask reaches the blocks cut to the analysed input, like the stream
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    a = analyze(model, {"input_ids": ids, "attention_mask": mask}, point=1, position=2, probes="prefix")
    b = analyze(model, {"input_ids": ids[1:2, :3]}, position=2, probes="prefix")
    assert_close(a["prefix_erank"].to_numpy(), b["prefix_erank"].to_numpy(), 1e-9)
    with pytest.raises(BlockError, match="position=7: the inputs have 5 tokens"):
        analyze(model, ids, position=7)
    with pytest.raises(BlockError, match="position=0 picks a token"):
        analyze(nn.Sequential(Residual(4, 0)), torch.randn(2, 4, dtype=F64), blocks=["0"], position=0)


def test_gpt2_branch_is_the_ffn_probe_and_prefix_autograd():
    quiet_transformers()
    lm = build_causal_lm(config="gpt2", pretrained=None, width=32, depth=3, heads=None, seeds=(0, 1),
                         prompt_ids=DEFAULT_PROMPT_IDS, prompt=None, tokenizer=None, position=-1,
                         dtype=F64, device="cpu")
    frame = analyze(lm)
    assert len(frame) == 6 and list(frame["member"]) == [0, 0, 0, 1, 1, 1]
    for e in range(2):
        stream, ffn_in = lm.trace(e)
        ratio = ffn_jacobians(lm, e, ffn_in).flatten(1).norm(dim=1) / math.sqrt(32)  # closed form
        assert_close(frame.query(f"member == {e}")["branch_ratio"].to_numpy(), ratio)
    model = lm.members[0]
    ids = lm.prompt_ids
    wte = model.transformer.wte(ids)

    def last(e):  # h_3 at the last token from its token embedding (h_0 = wte + wpe)
        x = torch.cat([wte[:, :-1], e[None, None]], 1)
        return model(inputs_embeds=x, output_hidden_states=True).hidden_states[2][0, -1]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        j = torch.func.jacrev(last)(wte[0, -1])
    row = frame.query("member == 0").iloc[1]
    assert_close(row["prefix_erank"], erank(j) / 32)
    assert_close(row["prefix_stable_rank"], stable_rank(j))


# --------------------------------------------------------------------------- ConvNets
def test_resnet18_within_stage_blocks():
    import torchvision

    net = torchvision.models.resnet18(weights=None).to(F64)
    x = torch.randn(2, 3, 16, 16, dtype=F64)
    frame = analyze(net, x)
    assert list(frame["name"]) == ["layer1.0", "layer1.1", "layer2.1", "layer3.1", "layer4.1"]
    assert list(frame["stage"]) == [1, 1, 2, 3, 4]  # the prefix restarts after each downsampling block
    assert list(frame["dim"]) == [64 * 16, 64 * 16, 128 * 4, 256, 512]
    assert frame["branch_kind"].eq("residual_function").all()
    net.eval()
    b1, b2 = net.layer1[0], net.layer1[1]
    stem = net.maxpool(net.relu(net.bn1(net.conv1(x))))[0]
    f1 = lambda v: b1(v.reshape(1, 64, 4, 4)).reshape(-1)  # noqa: E731
    f2 = lambda v: b2(v.reshape(1, 64, 4, 4)).reshape(-1)  # noqa: E731
    h0 = stem.reshape(-1)
    j = torch.func.jacrev(lambda v: f2(f1(v)))(h0)
    assert_close(frame["prefix_erank"][1], erank(j) / 1024)
    jf = torch.func.jacrev(lambda v: b1.bn2(b1.conv2(b1.relu(b1.bn1(b1.conv1(v.reshape(1, 64, 4, 4)))))).reshape(-1))(h0)
    assert_close(frame["branch_ratio"][0], jf.norm() / 32)
    assert net.training is False and net.layer1[0].training is False


def test_cifar_resnet_members_are_their_seeds():
    two = CifarResNet(8, seeds=(0, 7), dtype=F64)
    one = CifarResNet(8, seeds=(7,), dtype=F64)
    x = torch.randn(3, 3, 32, 32, dtype=F64) * 0.1
    x = x[:, :, :8, :8]  # the stem is a conv: any image size; D = 16·8·8
    a = analyze(two, x, probes=["branch", "representation"]).query("member == 1").reset_index(drop=True)
    b = analyze(one, x, probes=["branch", "representation"])
    assert list(b["dim"]) == [16 * 64] and b["branch_kind"][0] == "residual_function"
    num = [c for c in a.columns if a[c].dtype.kind == "f"]
    assert_close(a[num].to_numpy(), b[num].to_numpy(), 1e-9)


# --------------------------------------------------------------------------- errors and side effects
def test_clear_errors():
    with pytest.raises(BlockError, match="no blocks found in Sequential.*blocks="):
        analyze(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4))
    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 3))
    with pytest.raises(BlockError, match="'0' is not shape-preserving: input \\(4,\\) → output \\(3,\\)"):
        analyze(net, torch.randn(2, 4), blocks=["0"])
    shared = nn.Linear(3, 3)
    with pytest.raises(BlockError, match="called 2 times"):
        analyze(nn.Sequential(shared, shared), torch.randn(2, 3), blocks=[shared])
    with pytest.raises(BlockError, match="not a submodule"):
        analyze(net, torch.randn(2, 4), blocks=["7"])
    with pytest.raises(ValueError, match="probes: unknown \\['rank'\\]"):
        analyze(net, torch.randn(2, 4), blocks=["1"], probes=["rank"])
    with pytest.raises(ValueError, match="closed_form"):
        analyze(net, torch.randn(2, 4), blocks=["1"], method="closed_form")
    mlp = ResidualMLP(64, 2)
    with pytest.raises(SizeError, match="D = 64 need ≈ 0.00 GiB, above the bound.*max_dense_bytes"):
        analyze(mlp, 2, method="dense", max_dense_bytes=1000)
    with pytest.raises(SizeError, match="Lanczos basis.*MatrixFree"):
        analyze(mlp, 2, method="matrix_free", max_bytes=10_000)
    auto = analyze(mlp, 2, max_dense_bytes=1000, probes=["branch"])  # above the bound: estimates
    assert set(auto["method"]) == {"matrix_free"} and (auto["branch_erank_err"] > 0).all()
    with pytest.raises(ValueError, match="inputs of shape"):
        analyze(mlp, torch.randn(2, 3, 7, dtype=F64))


def test_the_model_is_left_as_it_was():
    d = 8
    net = nn.Sequential(Residual(d, 0), nn.Dropout(0.5), Residual(d, 1)).train()
    x = torch.randn(4, d, dtype=F64)
    before = [p.detach().clone() for p in net.parameters()]
    rng = torch.get_rng_state()
    frame = analyze(net, x, blocks=["0", "2"], method="matrix_free")
    assert list(frame["stage"]) == [1, 1]  # dropout is the identity in eval mode
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.training for m in net.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert all(torch.equal(a, b) and b.grad is None for a, b in zip(before, net.parameters(), strict=True))


def test_import_rankexp_is_cheap_and_lazy():
    import subprocess
    import sys

    code = ("import sys, rankexp; assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'analyze' in dir(rankexp); f = rankexp.analyze; "
            "import rankexp.instruments as i; assert f is i.analyze and rankexp.SpectralMonitor is i.SpectralMonitor; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="no attribute 'analyse'"):
        rankexp.analyse  # noqa: B018
