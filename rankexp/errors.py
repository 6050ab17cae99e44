"""The config error every check raises (torch-free; :mod:`rankexp.config` re-exports it).
Imports nothing of rankexp: the declarations and checks below everything raise it."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value outside what rankexp allows; the message names key, value and rule."""


def bad(key: str, value: Any, rule: str) -> ConfigError:
    """``invalid config: <key>=<value> — <rule>``: the one-line form of a refused value."""
    return ConfigError(f"invalid config: {key}={value!r} — {rule}")
