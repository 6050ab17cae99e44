"""Compose each job of a sweep once: Hydra's config loader with one template per group choice.

Hydra composes a job from scratch — defaults list, every YAML file, merges: about 0.1 s on
this machine — and its basic sweeper does it twice per job (to validate, then to launch).
The jobs of a sweep mostly differ in plain values (``alpha=1,2,3``), which Hydra applies
*after* composing the defaults list.  So a full composition happens once per distinct set of
config-group choices (``norm=post``, ``experiment=fig5``, …); each job is a copy of that
template with its value overrides applied by Hydra's own code, then Hydra's bookkeeping
(``hydra.overrides.task``, ``hydra.job.override_dirname``) set as Hydra sets it.
tests/test_compose_once.py checks the result equals Hydra's own composition.

**Each job composed and checked once.**  The whole-sweep check composes every job and checks
it (:meth:`TemplateConfigLoader.check`); the composed config is kept and handed to the launcher
when it asks for that job (the basic launcher composes each job again otherwise), and the check's
result — typed config, resolved config, config hash — waits in
:data:`rankexp.config.CHECKED_JOBS` for the job, which takes it instead of checking again
(:func:`rankexp.config.checked_job`).  Workers in other processes (joblib, Slurm) get neither:
they compose their one job and check it, once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict


class TemplateConfigLoader(ConfigLoaderImpl):
    """A :class:`ConfigLoaderImpl` on the same search path whose ``load_sweep_config`` composes
    once per group-choice set.  Jobs with a hydra override of their own (a swept
    ``hydra.launcher.*``) are composed in full, as Hydra would."""

    def __init__(self, inner: ConfigLoaderImpl):
        super().__init__(config_search_path=inner.get_search_path())
        self._templates: dict[tuple[str, ...], DictConfig] = {}
        self._checked: dict[tuple[str, ...], DictConfig] = {}  # composed + checked, not launched
        self.compositions = 0  # full compositions so far (the benchmark and tests count them)
        self.loads = 0  # job configs built (templates copied, overrides applied)
        from rankexp.config import CHECKED_JOBS

        CHECKED_JOBS.clear()  # a new sweep: nothing checked yet

    def __getstate__(self) -> dict[str, Any]:
        # shipped to joblib/submitit workers per job: without the templates or the checked
        # jobs, or every job would carry every template
        return {**self.__dict__, "_templates": {}, "_checked": {}}

    def check(self, cfg: DictConfig, *, device: bool = True, overrides: Sequence[str] | None = None):
        """Check one composed job (:func:`rankexp.config.check_task`) and keep it: the launch of
        this job gets this very config, and the job the check's result.

        Raises:
            ConfigError: what the check refuses.
        """
        from rankexp.config import CHECKED_JOBS, check_task

        checked = check_task(cfg, device=device, overrides=overrides)
        key = tuple(cfg.hydra.overrides.task)
        self._checked[key] = cfg
        CHECKED_JOBS[key] = checked
        return checked

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: Sequence[str]) -> DictConfig:
        parsed = OverridesParser.create().parse_overrides(list(sweep_overrides))
        kept = self._checked.pop(tuple(o.input_line for o in parsed), None)
        if kept is not None:  # composed and checked for the whole-sweep check: launched as it is
            OmegaConf.set_readonly(kept.hydra, None)  # resolving the job dir may have locked it
            return kept
        self.loads += 1
        if any(o.is_hydra_override() or o.is_sweep_override() for o in parsed):
            return self._compose(master_config, sweep_overrides)
        groups = tuple(o.input_line for o in parsed if self._is_group(o))
        values = [o for o in parsed if not self._is_group(o)]
        template = self._templates.get(groups)
        if template is None:
            template = self._templates[groups] = self._compose(master_config, groups)
        cfg = copy.deepcopy(template)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        naming = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=parsed, kv_sep=naming.kv_sep, item_sep=naming.item_sep,
                exclude_keys=naming.exclude_keys)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    def _is_group(self, o: Any) -> bool:
        return not isinstance(o.value(), dict) and self.repository.group_exists(o.key_or_group)

    def _compose(self, master_config: DictConfig, overrides: Sequence[str]) -> DictConfig:
        self.compositions += 1
        return super().load_sweep_config(master_config, list(overrides))
