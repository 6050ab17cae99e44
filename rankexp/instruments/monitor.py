"""``rankexp.SpectralMonitor``: :func:`rankexp.instruments.analyze` every N optimizer steps.

Metrics ``<quantity>/block<l>`` (``…_m<e>`` per member) at ``step``, the table as
``spectra/step_<step>.csv`` and ``spectra_seconds``, go to the active MLflow run or any callable
``log(metrics, step)``. :func:`spectral_callback_class` wraps it as a Hugging Face ``TrainerCallback``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Collection

from torch import nn

from rankexp import tracking
from rankexp.tracking import Sink

from .core import analyze, resolve_probes

log = logging.getLogger(__name__)

ID_COLUMNS = ("step", "block", "name", "member", "stage", "dim", "method", "branch_kind", "rows")


def metric_names(frame, prefix: str = "") -> dict[str, float]:
    """A frame as metrics ``<prefix><column>/block<l>[_m<e>]`` (``*_err``: matrix-free only)."""
    several = frame["member"].nunique() > 1
    width = len(str(int(frame["block"].max())))
    out = {}
    for row in frame.to_dict("records"):
        tag = f"block{int(row['block']):0{width}d}" + (f"_m{int(row['member'])}" if several else "")
        for col, v in row.items():
            if col in ID_COLUMNS or (col.endswith("_err") and row["method"] != "matrix_free"):
                continue
            out[f"{prefix}{col}/{tag}"] = float(v)
    return out


class SpectralMonitor:
    """:func:`~rankexp.instruments.analyze` at chosen optimizer steps, logged and accumulated.

    Args:
        inputs: the fixed inputs of every checkpoint.
        every: measure when ``step % every == 0``; ``None``: only at ``steps``.
        steps: explicit steps to measure at as well.
        log: ``"auto"`` (the active MLflow run if any), ``"mlflow"`` (required), ``None`` (frames
            only) or a callable ``log(metrics, step)``.
        artifacts: also log each table as ``spectra/step_<step>.csv`` (MLflow only).
        prefix: prepended to every metric name.
        **analyze_kwargs: ``probes``, ``blocks`` and the rest as :func:`analyze`.

    Raises ValueError: neither ``every`` nor ``steps``, ``every`` < 1, unknown probes, bad ``log``.
    """

    def __init__(self, model: nn.Module, inputs=None, *, every: int | None = 100,
                 steps: Collection[int] | None = None, probes=None, blocks=None,
                 log: str | Sink | None = "auto", artifacts: bool = True, prefix: str = "",
                 **analyze_kwargs):
        if every is None and not steps:
            raise ValueError("SpectralMonitor: give every=N and/or steps=[…]")
        if every is not None and int(every) < 1:
            raise ValueError(f"SpectralMonitor(every={every}): must be ≥ 1")
        if not (log in ("auto", "mlflow", None) or callable(log)):
            raise ValueError(f"SpectralMonitor(log={log!r}): 'auto', 'mlflow', None or a callable")
        self.model, self.inputs, self.blocks = model, inputs, blocks
        self.every, self.steps = (int(every) if every is not None else None), frozenset(steps or ())
        self.probes = sorted(resolve_probes(probes))
        self.log, self.artifacts, self.prefix = log, artifacts, prefix
        self.analyze_kwargs = {"progress": False, **analyze_kwargs}
        self.frames: list = []
        self.seconds = 0.0  # total wall time spent measuring
        self._warned = False

    def due(self, step: int) -> bool:
        """Whether ``step`` is a checkpoint."""
        return step in self.steps or (self.every is not None and step % self.every == 0)

    def step(self, step: int, *, force: bool = False):
        """Measure at ``step`` if due (or ``force``): the frame (with ``step``), else ``None``."""
        if not (force or self.due(step)):
            return None
        t0 = time.perf_counter()
        frame = analyze(self.model, self.inputs, self.blocks, probes=self.probes, **self.analyze_kwargs)
        frame.insert(0, "step", int(step))
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        self.frames.append(frame)
        self._emit(frame, int(step), seconds)
        log.info("spectra at step %d: %d row(s) in %.2f s", step, len(frame), seconds)
        return frame

    @property
    def frame(self):
        """Every checkpoint's rows so far, one DataFrame (empty before the first)."""
        import pandas as pd

        return pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame()

    def _sink(self) -> tuple[Sink | None, bool]:
        if self.log is None:
            return None, False
        if callable(self.log):
            return self.log, False
        sink = tracking.active_run_sink(self.log == "mlflow", who="SpectralMonitor(log='mlflow')")
        if sink is None and not self._warned:
            log.warning("SpectralMonitor: no active MLflow run; keeping the frames only "
                        "(start a run, or pass log=None to silence this)")
            self._warned = True
        return sink, sink is not None

    def _emit(self, frame, step: int, seconds: float) -> None:
        sink, is_mlflow = self._sink()
        if sink is None:
            return
        metrics = metric_names(frame.drop(columns="step"), self.prefix)
        metrics[f"{self.prefix}spectra_seconds"] = seconds
        sink({k: v for k, v in metrics.items() if not math.isnan(v)} if is_mlflow else metrics, step)
        if is_mlflow and self.artifacts:
            tracking.log_active_text(frame.to_csv(index=False), f"spectra/step_{step:08d}.csv")

    def callback(self):
        """This monitor as a Hugging Face ``TrainerCallback`` (:func:`spectral_callback_class`)."""
        return spectral_callback_class()(self)


@functools.cache
def spectral_callback_class() -> type:
    """``SpectralCallback``: a ``TrainerCallback`` stepping a :class:`SpectralMonitor` at step 0
    and after every optimizer step, on the main process. Raises ImportError: no ``transformers``."""
    from ..models.gpt2 import transformers_module

    tf = transformers_module()

    class SpectralCallback(tf.TrainerCallback):
        def __init__(self, monitor: SpectralMonitor):
            self.monitor = monitor

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero and state.global_step == 0:
                self.monitor.step(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.monitor.step(state.global_step)

    SpectralCallback.__module__ = __name__
    return SpectralCallback
