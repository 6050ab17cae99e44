"""Weights drawn block by block as the forward sweep reaches them: a streamed ResidualMLP
measures exactly what one drawn whole measures, holds one block's weights, shows NaN to a reader
that bypasses its walk, and task=measure streams exactly when every probe reads the weights
through the one sweep."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from rankexp.cli import CONF_DIR
from rankexp.config import check_job
from rankexp.memory import seed_bytes, streams_weights, weight_bytes
from rankexp.models import build_model
from rankexp.models.mlp import ResidualMLP
from rankexp.probes.jacobian import SWEEP_NEEDS, forward_sweep
from rankexp.seeding import gaussian_input
from rankexp.tasks.measure import run_probes

FIELDS = ("rms", "erank", "stable_rank", "log_gain", "branch_ratio", "accumulated_branch",
          "io_unit", "io_singular_values")
CASES = {
    "relu": {},
    "tanh": {"activation": "tanh"},
    "M=1": {"matrices": 1},
    "swiglu": {"activation": "swiglu"},
    "post, skips of 2": {"placement": "post", "skip_every": 2},
    "float32": {"dtype": torch.float32},
}


def pair(**kw) -> tuple[ResidualMLP, ResidualMLP]:
    kw = {"seeds": [3, 4, 8], **kw}
    return ResidualMLP(48, 10, **kw), ResidualMLP(48, 10, streamed=True, **kw)


def inputs(model: ResidualMLP, batch: int = 1) -> torch.Tensor:
    p = next(model.parameters())
    return gaussian_input(model.seeds, model.width, batch=batch, dtype=p.dtype, device=p.device)


@pytest.mark.parametrize("case", list(CASES))
def test_a_streamed_sweep_is_the_whole_models_bit_for_bit(case):
    whole, streamed = pair(**CASES[case])
    h0 = inputs(whole)
    a, b = forward_sweep(whole, h0, needs=SWEEP_NEEDS), forward_sweep(streamed, h0, needs=SWEEP_NEEDS)
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    # twice: every walk draws its blocks again, from the same counters
    assert torch.equal(forward_sweep(streamed, h0).io_unit, a.io_unit)


def test_every_block_of_a_walk_holds_the_whole_models_weights():
    whole, streamed = pair()
    h = inputs(whole, batch=5)
    assert torch.equal(whole.trajectory(h)[-1], streamed.trajectory(h)[-1])
    for (_, bw), (_, bs) in zip(whole.walk(), streamed.walk(), strict=True):
        assert all(torch.equal(p, q) for p, q in zip(bw.parameters(), bs.parameters(), strict=True))


def test_a_streamed_model_holds_one_block_and_nan_outside_a_walk():
    _, streamed = pair()
    buffers = {p.data_ptr() for p in streamed.parameters()}
    assert len(buffers) == 2  # w_up and w_down of every block: one buffer each
    assert all(torch.isnan(p).all() for p in streamed.parameters())  # before any walk
    forward_sweep(streamed, inputs(streamed))
    assert all(torch.isnan(p).all() for p in streamed.parameters())  # after it
    x = inputs(streamed)
    assert torch.isnan(streamed.blocks[3](x, x)).all()  # a reader that bypasses walk()
    # a walk left early (an exception, a break) leaves NaN too
    for l, _ in streamed.walk():
        if l == 2:
            break
    assert all(torch.isnan(p).all() for p in streamed.parameters())


def test_drawing_time_is_counted_and_the_numbers_reach_the_probes():
    whole, streamed = pair()
    h0 = inputs(whole)
    before = streamed.draw_seconds[0]
    m_whole = run_probes(whole, ["io_jacobian", "profile", "branch_ratio"], h0=h0)
    m_streamed = run_probes(streamed, ["io_jacobian", "profile", "branch_ratio"], h0=h0)
    assert streamed.draw_seconds[0] > before and whole.draw_seconds[0] > 0
    assert m_whole.scalars == m_streamed.scalars
    for k, v in m_whole.series.items():
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for a, b in zip(v, m_streamed.series[k], strict=True)), k


def config(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return check_job(compose("config", [*overrides, "tracking=off"]))


def test_task_measure_streams_exactly_when_every_probe_reads_only_the_sweep():
    shape = ("width=64", "depth=24")
    streamed = config(*shape, "task.probes=[io_jacobian,profile,branch_ratio,accumulated_branch]")
    assert streams_weights(streamed)
    for other in ("task.probes=[io_jacobian,stream]", "task.probes=[representation]"):
        assert not streams_weights(config(*shape, other))
    assert not streams_weights(config(*shape, "task=train", "task.probes=[io_jacobian]"))
    gpu = config(*shape, "task.probes=[io_jacobian]")
    gpu.device = "cuda"  # (a GPU draws whole: no host sync per block inside the sweep)
    assert not streams_weights(gpu)
    assert not streams_weights(config("model=plain", "width=16", "depth=4", "task.probes=[io_jacobian]"))
    # the estimate holds one block's weights where the job streams, all L where it does not
    whole = config(*shape, "task.probes=[io_jacobian,stream]")
    assert weight_bytes(streamed, streamed=True) * 24 == weight_bytes(whole)
    assert seed_bytes(whole) - seed_bytes(streamed) == pytest.approx(23 / 24 * weight_bytes(whole))
    with pytest.raises(ValueError, match="block by block"):
        build_model(config("model=plain", "width=16", "depth=4"), streamed=True)
