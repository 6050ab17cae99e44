"""Benchmark of ``rankexp.analyze`` and ``rankexp.SpectralMonitor``, every number from one run.

    python -m benchmarks.bench_analyze                  # (a) and (b) below, 1 torch thread
    python -m benchmarks.bench_analyze --widths 1024    # (b) at one width only

(a) The monitor's overhead as a fraction of a training step, for two networks a user trains:
    rankexp's ResidualMLP (d=256, L=12, m/d=1, Pre-RMSNorm, batch 256, Adam, float32; the
    monitor on 64 fixed inputs through the engine's closed form) and a Hugging Face Llama
    (d=128, L=4, 4 heads, T=64, batch 8, AdamW, float32; the monitor on 2 fixed sequences,
    dense ``torch.func``).  Printed: the step time, the checkpoint time (all instruments, and
    each group alone), their ratio (one checkpoint costs that many steps), the fraction it adds
    at ``every=100``, and the measured slowdown of a short training run with ``every=5`` against
    the same run without the monitor.
(b) The matrix-free erank against dense at d = 1024, 2048, 4096: the branch Jacobian of one
    Pre-RMSNorm ReLU feedforward block ``h + W_down relu(W_up rms(h))`` (m/d = 4, float32, one
    input) by ``analyze(method="dense")`` (d Jacobian–vector products + an SVD) and by
    ``analyze(method="matrix_free")`` (the default 16 Rademacher vectors, ≤ 64 Lanczos steps): wall time of
    each whole call, the error of erank/d and of the stable rank against dense, and that error
    in units of the stated standard error.

Every number comes from one run on one torch thread; repeated timings inside it keep the best
(the least disturbed on a shared machine: 10 steps, 3 checkpoints, 2 interleaved rounds of the
20-step runs).  The commit, the date and the load average are printed first.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import subprocess
import time
from pathlib import Path

import torch
from torch import nn

from rankexp.instruments import MatrixFree, SpectralMonitor, analyze, block_records
from rankexp.models.mlp import ResidualMLP
from rankexp.models.norms import rmsnorm

ROOT = Path(__file__).resolve().parent.parent


def header() -> None:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"bench_analyze · commit {commit}{'+dirty' if dirty else ''} · "
          f"{datetime.datetime.now():%Y-%m-%d %H:%M} · load average {load} · "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cores")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- (a) monitor overhead
def mlp_job():
    torch.manual_seed(0)
    net = ResidualMLP(256, 12, expansion=1, seeds=[0], dtype=torch.float32)
    x, y = torch.randn(1, 256, 256), torch.randn(1, 256, 256)
    opt = torch.optim.Adam(net.parameters(), 1e-3)

    def step():
        loss = (net(x) - y).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return "ResidualMLP d=256 L=12 m/d=1, batch 256, closed form", net, 64, step


def llama_job():
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
    net = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 1000, (8, 64))
    opt = torch.optim.AdamW(net.parameters(), 1e-3)

    def step():
        loss = net(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return "Llama d=128 L=4 T=64, batch 8, dense torch.func", net, ids[:2], step


def overhead(job) -> None:
    name, net, inputs, step = job()
    mon = {p: SpectralMonitor(net, inputs, every=5, log=None, probes=p)
           for p in (None, "branch", "prefix", "representation")}
    step()
    for m in mon.values():  # warm-up: first calls load torch.func's decompositions
        m.step(0)
    t_step = min(timed(step) for _ in range(10))
    t_check = {p: min(timed(lambda m=m: m.step(0, force=True)) for _ in range(3)) for p, m in mon.items()}
    n = 20

    def monitored():
        for k in range(1, n + 1):
            step()
            mon[None].step(k)

    plain, with_monitor = math.inf, math.inf
    for _ in range(2):  # interleaved rounds, the best of each kept
        plain = min(plain, timed(lambda: [step() for _ in range(n)]))
        with_monitor = min(with_monitor, timed(monitored))
    c = t_check[None]
    print(f"  {name}: step {t_step * 1e3:.1f} ms; checkpoint {c * 1e3:.0f} ms = {c / t_step:.1f} steps "
          f"(branch {t_check['branch'] / t_step:.1f}, prefix {t_check['prefix'] / t_step:.1f}, "
          f"representation {t_check['representation'] / t_step:.2f} steps); at every=100: "
          f"+{c / t_step:.1f} % of training; measured, every=5 over {n} steps: {with_monitor / plain:.2f}× "
          f"the run without (predicted {1 + (n // 5) * c / (n * t_step):.2f}×)")


# --------------------------------------------------------------------------- (b) matrix-free vs dense
class PreNormFFN(nn.Module):
    """``h + W_down relu(W_up rms(h))``, weights N(0, 1/fan_in)."""

    def __init__(self, d: int, expansion: int = 4):
        super().__init__()
        self.up = nn.Linear(d, expansion * d, bias=False)
        self.down = nn.Linear(expansion * d, d, bias=False)
        for w in (self.up.weight, self.down.weight):
            nn.init.normal_(w, std=1 / math.sqrt(w.shape[1]))

    def forward(self, h):
        return h + self.down(torch.relu(self.up(rmsnorm(h))))


def matrix_free_vs_dense(widths) -> None:
    print(f"  {'d':>5} {'dense s':>8} {'matrix-free s':>14} {'speed-up':>9} {'erank/d dense':>14} "
          f"{'matrix-free ± err':>19} {'|Δ|/err':>8} {'stable rank dense':>18} {'mf ± err':>16} "
          f"{'|Δ|/err':>8} {'Lanczos steps':>14}")
    settings = MatrixFree()
    for d in widths:
        torch.manual_seed(d)
        net = nn.Sequential(PreNormFFN(d))
        x = torch.randn(1, d)
        kw = {"blocks": ["0"], "probes": ["branch"], "progress": False}
        t0 = time.perf_counter()
        dense = analyze(net, x, method="dense", **kw).iloc[0]
        t_dense = time.perf_counter() - t0
        t0 = time.perf_counter()
        rec = block_records(net, x, method="matrix_free", matrix_free=settings, **kw)[0]
        t_mf = time.perf_counter() - t0
        mf = rec.row()
        z_er = abs(mf["branch_erank"] - dense["branch_erank"]) / mf["branch_erank_err"]
        z_sr = abs(mf["branch_stable_rank"] - dense["branch_stable_rank"]) / mf["branch_stable_rank_err"]
        print(f"  {d:>5} {t_dense:>8.2f} {t_mf:>14.2f} {t_dense / t_mf:>8.1f}× {dense['branch_erank']:>14.4f} "
              f"{mf['branch_erank']:>10.4f} ± {mf['branch_erank_err']:.4f} {z_er:>8.2f} "
              f"{dense['branch_stable_rank']:>18.2f} {mf['branch_stable_rank']:>8.2f} ± "
              f"{mf['branch_stable_rank_err']:.2f} {z_sr:>8.2f} {rec.branch.steps:>14}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_analyze", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--only", choices=["monitor", "matrix_free"], help="run (a) or (b) alone")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    header()
    if args.only != "matrix_free":
        print("(a) SpectralMonitor overhead (one checkpoint = every instrument on every block)")
        for job in (mlp_job, llama_job):
            overhead(job)
    if args.only == "monitor":
        return
    print("(b) matrix-free vs dense: branch Jacobian of a Pre-RMSNorm ReLU FFN block, m/d=4, float32")
    with torch.no_grad():
        matrix_free_vs_dense(args.widths)


if __name__ == "__main__":
    main()
