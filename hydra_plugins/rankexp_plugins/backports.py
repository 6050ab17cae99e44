"""Hydra, faster where rankexp pays for it: a fix from Hydra's main branch that the installed
release (hydra-core 1.3.x) lacks, and its group listing done once per command line.

* **A copied config repository shares the ConfigStore** (Hydra PR #2928, "Use latest
  configstore singleton instead of storing it").  Hydra 1.3 deep-copies its config repository
  for every composition and for every config-group listing (``CachingConfigRepository``), and
  with it the whole ConfigStore its structured source holds — every schema node rankexp and the
  launcher plugins register, ~40 ms a copy here.  ``rankexp --help`` lists groups 269 times
  (7–17 s, issue 19), a tab press a few dozen times.  Upstream the structured source reads
  ``ConfigStore.instance()`` at each use, so a copy refers to the live store; here a copy of
  the source is a shallow one (its provider and path are strings, its store the singleton) —
  the same behaviour.  tests/test_cli.py checks that a copy made before a registration sees it.
* **Each group listed once per command line.**  ``ConfigLoaderImpl.get_group_options`` builds
  a fresh repository for its (config name, overrides) on every call — to apply the search-path
  overrides of that command line — and ``--help`` asks for the same listings twice (Hydra's
  help template computes its group sections eagerly).  Here the repository Hydra builds is kept
  per loader and command line, and each answer of it once: a loader lives for one command (a
  ``hydra.main`` run, one ``compose`` context, one sweep's template loader), within which
  Hydra itself takes the config tree as fixed.  tests/test_cli.py checks every listing of the
  tree against Hydra's own.

Installed on import of :mod:`hydra_plugins.rankexp_plugins`, which Hydra's plugin scan runs in
every Hydra process after it (re)loads its core plugins — the scan re-executes their modules,
so a patch made before it would be lost on the new class.
"""

from __future__ import annotations

import copy
import importlib
import weakref

from hydra.core.object_type import ObjectType


def _shallow(self, memo):
    """``copy.deepcopy`` of a ``StructuredConfigSource``: its fields, the one ConfigStore shared."""
    clone = copy.copy(self)
    memo[id(self)] = clone
    return clone


#: per config loader: the repositories Hydra built per (config name, overrides), and the listings
_LISTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None,
                   overrides=None):
    """``ConfigLoaderImpl.get_group_options`` with Hydra's repository for this command line
    kept, and each of its answers."""
    key = (config_name, tuple(overrides or ()))
    repos, listed = _LISTED.setdefault(self, ({}, {}))
    if key not in repos:
        repos[key] = self._parse_overrides_and_create_caching_repo(config_name, list(key[1]))[1]
    asked = (key, group_name, results_filter)
    if asked not in listed:
        listed[asked] = repos[key].get_group_options(group_name, results_filter)
    return list(listed[asked])


def install() -> None:
    """Apply the fixes above (idempotent)."""
    source = importlib.import_module("hydra._internal.core_plugins.structured_config_source")
    source.StructuredConfigSource.__deepcopy__ = _shallow
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl.get_group_options = _group_options
