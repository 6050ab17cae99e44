"""The weight generator (rankexp.seeding): SplitMix64 bits against its pure-Python specification,
the ziggurat against an independent scalar implementation of Marsaglia & Tsang's algorithm and
against the normal law, and the invariances the models rely on (members, chunks, dtypes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rankexp import seeding as S
from rankexp.models.convnet import CifarResNet
from rankexp.models.mlp import ResidualMLP
from rankexp.models.plain import PlainNet

M64 = (1 << 64) - 1


def _u64(x: int) -> int:
    return x & M64


def test_splitmix64_bits_equal_the_reference_on_every_counter():
    keys = [S.stream_key(s, t) for s, t in ((0, 0), (3, 0), (3, 1), (2**31 + 7, 17))]
    counters = [0, 1, 2, 1000, 2**40 + 5, S.COUNTER_SPAN - 1, 3 * S.COUNTER_SPAN + 11]
    got = S.splitmix64(torch.tensor([S._signed(k) for k in keys])[:, None], torch.tensor(counters)[None])
    for row, key in zip(got.tolist(), keys, strict=True):
        assert [_u64(v) for v in row] == [S.splitmix64_reference(key, n) for n in counters]
    # SplitMix64 seeded with 0 starts with Vigna's published outputs
    assert S.splitmix64_reference(0, 0) == 0xE220A8397B1DCDAF
    assert S.splitmix64_reference(0, 1) == 0x6E789E6AA1B965F4


def test_stream_keys_differ_across_seeds_and_streams():
    keys = {S.stream_key(s, t) for s in range(50) for t in range(4)}
    assert len(keys) == 200
    assert S.seeded_generator(3, 1).initial_seed() == S.stream_key(3, 1) & (2**63 - 1)


# --------------------------------------------------------------------------- exp and log
def _exp(y: float) -> float:
    """seeding.exact_exp as its specification, in Python floats (IEEE doubles, no FMA)."""
    k = round(y * S.INV_LN2)  # Python's round: half to even, as torch.round
    r = (y - k * S.LN2_HI) - k * S.LN2_LO
    p = S.EXP_COEFFS[-1]
    for c in reversed(S.EXP_COEFFS[:-1]):
        p = p * r + c
    return p * 2.0 ** min(max(k, -S.EXP_DOMAIN), 0)


def _log(u: float) -> float:
    """seeding.exact_log as its specification, in Python floats."""
    m, e = math.frexp(u)
    if m < S.SQRT_HALF:
        m, e = m + m, e - 1
    f = m - 1.0
    s = f / (f + 2.0)
    z, q = s * s, S.LOG_COEFFS[-1]
    for c in reversed(S.LOG_COEFFS[:-1]):
        q = q * z + c
    return e * S.LN2_HI + (e * S.LN2_LO + (s + s) * q)


def test_exact_exp_and_log_are_within_a_few_ulp_and_the_same_bits_as_their_specification():
    """Against NumPy's exp/log (glibc's, < 1 ulp): exp ≤ 1 ulp on its domain, log ≤ 3 ulp
    (its worst case is near √½, where s is largest); every value equals the scalar Python
    specification bit for bit (the torch kernels' SIMD and scalar loops round the same)."""
    g = torch.Generator().manual_seed(5)
    u = torch.cat([torch.rand(400_000, dtype=torch.float64, generator=g).clamp_(min=2.0**-60),
                   1 - torch.rand(1000, dtype=torch.float64, generator=g) * 1e-9,
                   torch.tensor([2.0**-54, 0.5, S.SQRT_HALF, 1 - 2.0**-53], dtype=torch.float64)])
    log = S.exact_log(u).numpy()
    ulp = np.abs(log - np.log(u.numpy())) / np.spacing(np.abs(np.log(u.numpy())))
    assert ulp.max() <= 3
    y = torch.cat([-torch.rand(400_000, dtype=torch.float64, generator=g) * S.EXP_DOMAIN * math.log(2),
                   torch.tensor([0.0, -0.5 * S.ZIGGURAT_R**2, -1e-300], dtype=torch.float64)])
    exp = S.exact_exp(y).numpy()
    assert (np.abs(exp - np.exp(y.numpy())) / np.spacing(np.exp(y.numpy()))).max() <= 1
    pick = torch.randint(0, u.numel(), (3000,), generator=g)
    assert [_log(v) for v in u[pick].tolist()] == log[pick.numpy()].tolist()
    assert [_exp(v) for v in y[pick % y.numel()].tolist()] == exp[(pick % y.numel()).numpy()].tolist()
    # tails of the kernels: a length that leaves a SIMD remainder gives the same bits per value
    assert torch.equal(S.exact_log(u[:1003]), S.exact_log(u)[:1003])
    assert torch.equal(S.exact_exp(y[5:12]), S.exact_exp(y)[5:12])


# --------------------------------------------------------------------------- a scalar ziggurat
def _reference_normal(key: int, n: int) -> float:
    """Marsaglia & Tsang (2000) RNOR/nfix written from the paper for one draw, scalar Python,
    on the bit layout of rankexp.seeding (layer = low 8 bits, hz = the signed top 53 bits), with
    the exp and log of its specification (:func:`_exp`, :func:`_log`)."""
    w, f, k = S._ziggurat_tables()
    r = S.ZIGGURAT_R

    def bits(counter):
        return S.splitmix64_reference(key, counter)

    def split(z):
        hz = z >> 11
        return z & 255, hz - (1 << 53) if hz >= 1 << 52 else hz

    def uni(z):
        return ((z >> 11) + 0.5) * 2.0**-53

    iz, hz = split(bits(n))
    if abs(hz) < k[iz]:
        return hz * w[iz]
    t = 1
    while True:
        u1, z2 = uni(bits(n + t * S.COUNTER_SPAN)), bits(n + (t + 1) * S.COUNTER_SPAN)
        t += 2
        if iz == 0:  # the tail, in its own loop
            x = -_log(u1) / r
            if -2.0 * _log(uni(z2)) > x * x:
                return r + x if hz > 0 else -r - x
            continue
        x = hz * w[iz]
        if u1 * (f[iz - 1] - f[iz]) + f[iz] < _exp(-0.5 * x * x):
            return x
        iz, hz = split(z2)
        if abs(hz) < k[iz]:
            return hz * w[iz]


def test_normal_equals_the_scalar_ziggurat_bit_for_bit_including_the_slow_path():
    out = torch.empty(2, 6000, dtype=torch.float64)
    S.normal_(out, [7, 8])
    for e, seed in enumerate((7, 8)):
        key = S.stream_key(seed, S.STREAM_WEIGHTS)
        ref = [_reference_normal(key, n) for n in range(6000)]
        np.testing.assert_array_equal(out[e].numpy(), np.array(ref))
    # the slow path was exercised: some draws are beyond r (the tail) or came from a wedge
    assert (out.abs() > S.ZIGGURAT_R).any()


def test_ziggurat_layers_have_equal_area_and_close_at_the_top():
    w, f, _ = S._ziggurat_tables()
    x = [wi * 2.0**52 for wi in w]  # right edges x_i (x_0 is the base strip's width v/f(r))
    r = S.ZIGGURAT_R
    v = r * math.exp(-r * r / 2) + math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))
    assert x[0] * math.exp(-r * r / 2) == pytest.approx(v, rel=1e-15)
    for i in range(2, S.ZIGGURAT_LAYERS):
        assert x[i] * (f[i - 1] - f[i]) == pytest.approx(v, rel=1e-12), i
    assert x[1] * (1 - f[1]) == pytest.approx(v, rel=1e-12)  # the top layer closes


def test_normal_draws_follow_the_normal_law():
    """4M draws: χ² over 200 equal-probability bins and over the tail, KS, moments; the slow
    path (≈ 1.5 % of draws) decides the tail and the wedges, so a wrong nfix fails here."""
    out = torch.empty(1, 4_000_000, dtype=torch.float64)
    S.normal_(out, [2024])
    x = out[0].numpy()
    edges = stats.norm.ppf(np.linspace(0, 1, 201))
    counts, _ = np.histogram(x, edges)
    assert stats.chisquare(counts).pvalue > 1e-4
    beyond = [3.0, S.ZIGGURAT_R, 4.0, 4.5]
    obs = np.array([(np.abs(x) > b).sum() for b in beyond])
    expected = 2 * stats.norm.sf(beyond) * x.size
    assert np.all(np.abs(obs - expected) < 5 * np.sqrt(expected)), (obs, expected)
    assert stats.kstest(x[:1_000_000], "norm").pvalue > 1e-4
    assert abs(x.mean()) < 5 / math.sqrt(x.size) and abs(x.var() - 1) < 5 * math.sqrt(2 / x.size)


def test_a_wrong_slow_path_is_caught(monkeypatch):
    """The law test above can fail: keeping the fast path's value for rejected draws (no nfix)
    puts mass outside the normal law, and the χ² sees it (torch's path: the compiled one takes
    the slow path itself, and equals this one bit for bit, tested below)."""
    monkeypatch.setattr(native, "ziggurat", lambda: None)
    monkeypatch.setattr(S, "_nfix", lambda keys, counters, layer, j:
                        j.to(torch.float64) * S._tables_on(j.device, torch.float64)[1][layer])
    out = torch.empty(1, 4_000_000, dtype=torch.float64)
    S.normal_(out, [2024])
    counts, _ = np.histogram(out[0].numpy(), stats.norm.ppf(np.linspace(0, 1, 201)))
    assert stats.chisquare(counts).pvalue < 1e-6


def test_members_chunks_and_calls_do_not_change_a_draw(monkeypatch):
    seeds = [5, 9, 11]
    whole = torch.empty(3, 50_000, dtype=torch.float64)
    S.normal_(whole, seeds, offset=123)
    alone = torch.empty(1, 50_000, dtype=torch.float64)
    S.normal_(alone, [9], offset=123)
    assert torch.equal(whole[1], alone[0])
    split = torch.empty(3, 50_000, dtype=torch.float64)
    S.normal_many_([(split[:, :17_001].contiguous(), 123, 1.0)], seeds)  # shapes of its own
    parts = [torch.empty(3, 17_001, dtype=torch.float64), torch.empty(3, 32_999, dtype=torch.float64)]
    S.normal_many_([(parts[0], 123, 1.0), (parts[1], 123 + 17_001, 1.0)], seeds)
    assert torch.equal(torch.cat(parts, 1), whole)
    monkeypatch.setattr(S, "CPU_CHUNK", 1000)
    S.normal_(split, seeds, offset=123)
    assert torch.equal(split, whole)


THREADED_DRAW = """
import math, torch
from rankexp import seeding as S
shapes = [(2, 300, 70), (2, 70, 300), (2, 5, 5), (2, 300, 70)]
def draw():
    outs = [torch.empty(shape, dtype=torch.float64) for shape in shapes]
    targets, offset = [], 0
    for out in outs:
        targets.append((out, offset, 0.5 / math.sqrt(out.shape[-1])))
        offset += out[0].numel()
    S.normal_many_(targets, [4, 7])
    return outs
workers, fast = [], S._fast_path
S._fast_path = lambda *a: (workers.append(torch.get_num_threads()), fast(*a))[1]
two = draw()
print("threads", S.draw_threads(len(shapes)), S.draw_threads(1), torch.get_num_threads(), workers)
torch.set_num_threads(1)
one = draw()
print("equal", all(torch.equal(a, b) for a, b in zip(one, two, strict=True)), S.draw_threads(4))
"""


def test_threads_draw_the_same_numbers_and_restore_the_thread_count():
    """At ``OMP_NUM_THREADS=2`` the CPU fast path runs on 2 worker threads, matrix by matrix,
    each op on one torch thread; every weight equals the one-thread draw bit for bit (slow path
    included), and the job's thread count is 2 again afterwards (a fresh process: OpenMP's
    thread count of a new thread comes from the environment)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", THREADED_DRAW], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["threads 2 1 2 [1, 1, 1, 1]", "equal True 1"]


def test_float32_draws_are_the_float64_ones_to_rounding_and_scale_is_exact_enough():
    d64, d32 = torch.empty(2, 200_000, dtype=torch.float64), torch.empty(2, 200_000)
    S.normal_(d64, [1, 2], scale=0.3)
    S.normal_(d32, [1, 2], scale=0.3)
    rel = ((d32.double() - d64).abs() / d64.abs().clamp(min=1e-30)).max()
    assert 0 < rel <= 3 * 2.0**-24 * (1 + 2.0**-20)  # float32(j), float32(σ w_i), their product
    unit = torch.empty(2, 200_000, dtype=torch.float64)
    S.normal_(unit, [1, 2])
    # j·fl(σ w_i) against σ·fl(j w_i): two roundings on either side
    torch.testing.assert_close(d64, 0.3 * unit, rtol=4 * 2.0**-53, atol=0)


def test_uniform_is_the_top_53_bits_of_the_stream():
    out = torch.empty(2, 1000, dtype=torch.float64)
    S.uniform_(out, [4, 6], offset=77, low=-2.0, high=3.0)
    for e, seed in enumerate((4, 6)):
        key = S.stream_key(seed, S.STREAM_WEIGHTS)
        u = [((S.splitmix64_reference(key, 77 + n) >> 11) + 0.5) * 2.0**-53 for n in range(1000)]
        torch.testing.assert_close(out[e], torch.tensor(u, dtype=torch.float64) * 5 - 2,
                                   rtol=0, atol=4e-16)
    assert out.min() > -2 and out.max() < 3


def test_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="members first"):
        S.normal_(torch.empty(3, 4), [1, 2])
    with pytest.raises(ValueError, match="contiguous"):
        S.normal_(torch.empty(4, 2).T, [1, 2])
    with pytest.raises(ValueError, match="outside"):
        S.normal_(torch.empty(1, 4), [1], offset=S.COUNTER_SPAN - 2)


# --------------------------------------------------------------------------- the families
def test_mlp_weights_are_the_documented_stream_numbers_in_their_dtype():
    """Block by block, w_up then w_down, row-major, α/√fan_in · N(0, 1) of the seed's weight
    stream; a float32 network holds them drawn in float32 (within 3 ulp of the float64 ones)."""
    alpha, width, m = 1.7, 12, 24
    f64 = ResidualMLP(width, 3, expansion=2, alpha=alpha, seeds=[3, 5])
    f32 = ResidualMLP(width, 3, expansion=2, alpha=alpha, seeds=[3, 5], dtype=torch.float32)
    offset = 0
    for b64, b32 in zip(f64.blocks, f32.blocks, strict=True):
        for name in b64.weight_names():
            p = getattr(b64, name)
            ref = torch.empty_like(p)
            S.normal_(ref, [3, 5], offset=offset, scale=alpha / math.sqrt(p.shape[-1]))
            assert torch.equal(p, ref), name
            q = getattr(b32, name)
            assert q.dtype == torch.float32
            assert ((q.double() - p).abs() <= 3 * 2.0**-24 * (1 + 2.0**-20) * p.abs()).all()
            offset += p[0].numel()
    assert offset == 3 * 2 * width * m


@pytest.mark.parametrize("family", ["mlp", "plain", "cifar_resnet"])
def test_member_e_is_the_one_member_network_of_its_seed(family):
    def build(seeds):
        if family == "mlp":
            return ResidualMLP(10, 4, expansion=2, seeds=seeds)
        if family == "plain":
            return PlainNet(10, 4, init="orthogonal", bias=0.3, seeds=seeds)
        return CifarResNet(8, base_width=4, seeds=seeds, dtype=torch.float64)

    batch, one = build([4, 7, 9]), build([7])
    for (name, p), q in zip(batch.named_parameters(), one.parameters(), strict=True):
        assert torch.equal(p[1], q[0]), name


def test_plain_orthogonal_weights_are_sigma_w_haar():
    net = PlainNet(16, 3, init="orthogonal", alpha=1.3, seeds=[0, 1])
    for layer in net.blocks:
        q = layer.w / 1.3
        torch.testing.assert_close(q @ q.mT, torch.eye(16, dtype=q.dtype).expand(2, 16, 16),
                                   rtol=0, atol=1e-14)


# --------------------------------------------------------------------------- the compiled fast path
from rankexp import native  # noqa: E402

needs_native = pytest.mark.skipif(native.ziggurat() is None,
                                  reason="no C compiler here: the torch path draws (same numbers)")


@needs_native
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_compiled_fast_path_draws_the_torch_paths_numbers(monkeypatch, dtype):
    """rankexp/_ziggurat.c against the torch ops it replaces, bit for bit: several members, an
    offset, a scale, a length that is no multiple of the block, a tiny weight matrix."""
    shapes = [(3, 4096 * 2 + 17), (3, 5, 5), (3, 300, 70)]

    def draw():
        outs = [torch.empty(shape, dtype=dtype) for shape in shapes]
        S.normal_many_([(o, 1000 * i + 7, 0.3 + i) for i, o in enumerate(outs)], [0, 5, 9])
        return outs

    compiled = draw()
    monkeypatch.setattr(native, "ziggurat", lambda: None)
    for a, b in zip(compiled, draw(), strict=True):
        assert torch.equal(a, b)


@needs_native
def test_the_compiled_slow_path_takes_1_5_percent_and_columns_are_the_whole_draws():
    """The kernel reports how many draws took the slow path (the ziggurat's ≈ 1.5 %); drawing
    only some columns of each member's matrix gives exactly the whole draw's numbers there and
    leaves the other columns as they were, in float64 and float32, several members, a scale."""
    z = native.ziggurat()
    keys = S.stream_keys([3, 4], S.STREAM_WEIGHTS)
    w, w64, f64, k = S._tables_on(torch.device("cpu"), torch.float64)
    out = torch.empty(2, 50_000, dtype=torch.float64)
    assert 0.013 < z.normal(out, keys, 11, w, k, w64, f64, 1.0) / out.numel() < 0.017
    for dtype in (torch.float64, torch.float32):
        draws = S.MatrixDraws([3, 4], S.STREAM_WEIGHTS, 0.2, dtype, "cpu")
        whole = torch.empty(2, 300, 70, dtype=dtype)
        draws.full(whole, 123)
        cols = [torch.tensor([0, 5, 6, 69]), torch.arange(0, 70, 3)]
        part = torch.full((2, 300, 70), 7.0, dtype=dtype)
        assert draws.columns(part, 123, cols)
        for e, c in enumerate(cols):
            assert torch.equal(part[e][:, c], whole[e][:, c])
            rest = torch.ones(70, dtype=torch.bool)
            rest[c] = False
            assert (part[e][:, rest] == 7.0).all()
    with pytest.raises(ValueError, match="one column list per member"):
        draws.columns(part, 123, cols[:1])


BUILD = """
import sys
from rankexp import native
z = native.ziggurat()
print(z is not None and native.library_path().exists())
"""


@needs_native
def test_two_first_jobs_build_the_library_at_once(tmp_path):
    """Two real processes started together on an empty cache both build (or find) the library
    and load it, five times over; no temporary file is left behind."""
    import os
    import subprocess
    import sys

    for trial in range(5):
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / str(trial))}
        procs = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        assert [p.communicate()[0].strip() for p in procs] == ["True", "True"]
        built = list((tmp_path / str(trial) / "rankexp" / "native").iterdir())
        assert len(built) == 1 and built[0].suffix == ".so", built


def test_without_a_compiler_or_when_disabled_the_torch_path_draws(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="no-such-cc|failed"):
        native.build()
    assert native.ziggurat.__wrapped__() is None
    monkeypatch.setenv("RANKEXP_NATIVE", "0")
    monkeypatch.delenv("CC")
    assert native.ziggurat.__wrapped__() is None
    assert not any(tmp_path.rglob("*.so"))
