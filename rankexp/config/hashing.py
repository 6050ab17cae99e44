"""The config hash: what a run computes, as 16 hex digits (resume keys on it), with the rules
that keep a v1 config's hash (later knobs, options and norm slots at their defaults).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..knobs import default
from ..locations import DATA_CACHE
from .schema import _preset_slot, given_options

#: config keys that say where/how a run is recorded, not what it computes
NON_SEMANTIC_KEYS = ("tracking", "device", "threads", "hydra", "size")
#: knobs added after v1: at these defaults they stay out of the hash, so runs logged before
#: they existed still match (resume skips them) — a config with default bias/init is unchanged
LATER_KNOB_DEFAULTS = {"bias": 0.0, "init": "gaussian"}
#: ``task.*`` knobs added after v1, by task: at these defaults they stay out of the hash
LATER_TASK_KNOB_DEFAULTS = {"train": {"probe_every": None, "probe_steps": None}}
#: keys that say where a run reads and writes, how often it reports and checkpoints, how it is
#: compiled — not what it computes: out of the hash (logged as params all the same), so moved
#: data or another cluster's paths find the same runs
PLACE_KEYS = {"data": ("root", "cache_dir", "download"),
              "task": ("checkpoint_dir", "checkpoint_every", "log_every", "compile", "cuda_graphs")}
#: a legacy hash (what runs logged before PLACE_KEYS left the hash carry) takes these keys'
#: earlier defaults where they are at today's (the caches moved to the user's cache dir)
LEGACY_DEFAULTS = {
    ("data", "cache_dir"): (DATA_CACHE, ".cache"),
    ("task", "checkpoint_dir"): (default("task.checkpoint_dir"), ".cache/checkpoints")}


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python (enums as strings, no ``hydra`` node)."""
    c = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    c.pop("hydra", None)
    return c


def config_hash(container: dict[str, Any], legacy: bool = False) -> str:
    """Stable 16-hex-digit hash of what a run computes (the tracking/device keys and
    :data:`PLACE_KEYS` excluded); resume skips configs whose hash already FINISHED.
    ``legacy``: the hash runs logged before PLACE_KEYS left it carry (:data:`LEGACY_DEFAULTS`)."""
    semantic = {k: v for k, v in container.items() if k not in NON_SEMANTIC_KEYS
                and not (k in LATER_KNOB_DEFAULTS and v == LATER_KNOB_DEFAULTS[k])}
    for node, keys in PLACE_KEYS.items():
        if isinstance(semantic.get(node), dict):
            semantic[node] = {k: (_legacy(node, k, v) if legacy else v)
                              for k, v in semantic[node].items() if legacy or k not in keys}
    if semantic.get("task", {}).get("name") == "measure":
        semantic.pop("data", None)
        semantic.pop("lr", None)
        # seed chunking never changes a number (tested), so the budget is not part of the hash
        semantic["task"] = {k: v for k, v in semantic["task"].items() if k != "max_memory_gb"}
    task = semantic.get("task")
    later = LATER_TASK_KNOB_DEFAULTS.get(task.get("name")) if isinstance(task, dict) else None
    if later:
        semantic["task"] = {k: v for k, v in task.items() if not (k in later and v == later[k])}
    if isinstance(semantic.get("task"), dict) and "options" in semantic["task"]:
        # an option at its declared default adds nothing: v1's `options: {}` keeps its hash
        semantic["task"] = {**semantic["task"], "options": given_options(semantic["task"]["options"])}
    norm = semantic.get("norm")
    if isinstance(norm, dict) and {"placement", "op"} <= norm.keys():
        # a slot that only repeats its preset adds nothing: configs v1 could express keep v1's hash
        semantic["norm"] = {k: v for k, v in norm.items()
                            if not (k in ("pre", "out", "post")
                                    and v == _preset_slot(k, norm["placement"], norm["op"]))}
    blob = json.dumps(semantic, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _legacy(node: str, key: str, value: Any) -> Any:
    today, before = LEGACY_DEFAULTS.get((node, key), (None, None))
    return before if today is not None and value == today else value


def flatten(container: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"norm": {"op": "rmsnorm"}} → {"norm.op": "rmsnorm"}``; lists become strings."""
    out: dict[str, Any] = {}
    for k, v in container.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
