"""The caller's own MLflow run (MLflow's fluent API: ``with mlflow.start_run(): …``), for the
instruments a user puts in their own training loop (:class:`rankexp.SpectralMonitor`): rankexp
logs to it without opening or closing it.  MLflow is imported only when a run is logged to."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .schema import MAX_METRICS

#: ``log(metrics, step)``: where a checkpoint's numbers go
Sink = Callable[[Mapping[str, float], int], None]


def active_run_sink(required: bool, who: str = "rankexp") -> Sink | None:
    """``log(metrics, step)`` into the active MLflow run (``mlflow.log_metrics``, at most
    1000 metrics per request, MLflow's ``log_batch`` limit), or ``None`` when there is no
    active run and ``required`` is False.

    Raises:
        RuntimeError: ``required`` and no active run (the message names ``who``).
    """
    import mlflow

    if mlflow.active_run() is None:
        if required:
            raise RuntimeError(f"{who}: no active MLflow run "
                               "(wrap training in `with mlflow.start_run():`)")
        return None

    def sink(metrics: Mapping[str, float], step: int) -> None:
        items = list(metrics.items())
        for i in range(0, len(items), MAX_METRICS):
            mlflow.log_metrics(dict(items[i:i + MAX_METRICS]), step=step)
    return sink


def log_active_text(text: str, artifact_file: str) -> None:
    """``text`` as the artifact ``artifact_file`` (a path inside the run's artifacts, e.g.
    ``spectra/step_00000100.csv``) of the active MLflow run (``mlflow.log_text``)."""
    import mlflow

    mlflow.log_text(text, artifact_file)
