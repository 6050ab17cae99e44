"""The plain result object every task returns and tracking logs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor


@dataclass
class Measurement:
    """What probes return and tracking logs: ``scalars`` (name → float, metrics at step 0),
    ``series`` (name → (steps, values), 1-D; steps: layer index l or path order k), ``arrays``
    (name → raw array, saved as ``.npz``), ``seed_arrays`` (arrays whose axis 0 is the seed,
    so results of disjoint seed chunks join exactly)."""

    scalars: dict[str, float] = field(default_factory=dict)
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    seed_arrays: set[str] = field(default_factory=set)

    def update(self, other: Measurement) -> None:
        for mine, theirs in ((self.scalars, other.scalars), (self.series, other.series),
                             (self.arrays, other.arrays)):
            clash = mine.keys() & theirs.keys()
            if clash:
                raise ValueError(f"two probes produced the same key(s): {sorted(clash)}")
            mine.update(theirs)
        self.seed_arrays |= other.seed_arrays

    def add_seed_array(self, name: str, per_seed) -> np.ndarray:
        """Keep a raw per-seed array ``(E, ...)`` (saved, joined across seed chunks); returns it."""
        v = per_seed.detach().double().cpu().numpy() if isinstance(per_seed, Tensor) else np.asarray(per_seed)
        self.arrays[name] = v
        self.seed_arrays.add(name)
        return v

    def add_seed_stat(self, name: str, per_seed: Tensor) -> None:
        """Add mean and std over seeds of a per-seed scalar ``(E,)``, and keep the raw values."""
        v = self.add_seed_array(name, per_seed)
        self.scalars[name] = float(v.mean())
        self.scalars[f"{name}_std"] = float(v.std(ddof=1)) if v.size > 1 else 0.0

    def add_seed_series(self, name: str, per_seed: Tensor, steps: Sequence[int]) -> None:
        """Add the mean and std over seeds of a per-seed series ``(E, n)``, keep the raw values."""
        v, steps = self.add_seed_array(name, per_seed), np.asarray(steps)
        self.series[name] = (steps, v.mean(0))
        if v.shape[0] > 1:
            self.series[f"{name}_std"] = (steps, v.std(0, ddof=1))
