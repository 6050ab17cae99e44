"""The degradation replication's claims (:data:`analysis.degradation.CLAIMS`) in the report's
registry (:mod:`analysis.claims`; this module is one of its :data:`~analysis.claims.PLUGINS`).

Each :class:`~analysis.degradation.ClaimSpec` becomes a :class:`~analysis.claims.Claim` of
experiment ``degradation`` whose measure builds the replication's tables from the loaded runs
(:func:`analysis.degradation.claim_tables`, once per store) and reads its value; a table or
entry the runs do not provide (no size=full training yet, a depth missing) is ``not run``.
"""

from __future__ import annotations

from .claims import Check, Claim, Measured, NotRun, Runs, register
from .degradation import CLAIMS, EXPERIMENT, ClaimSpec, claim_tables

_TABLES: dict[int, dict] = {}


def _tables(runs: Runs) -> dict:
    key = id(runs)
    if key not in _TABLES:
        _TABLES.clear()  # one store at a time
        _TABLES[key] = claim_tables(runs.uri, runs(EXPERIMENT))
    return _TABLES[key]


def _measure(spec: ClaimSpec):
    def measure(runs: Runs) -> Measured:
        try:
            return Measured(spec.value(_tables(runs)))
        except KeyError as e:
            raise NotRun(f"the degradation runs do not give it: {e}") from e

    return measure


for _spec in CLAIMS:
    register(Claim(_spec.id, EXPERIMENT, _spec.statement, _spec.source, _spec.study,
                   Check(_spec.tolerance, _spec.passes), _measure(_spec)))
