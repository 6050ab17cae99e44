"""One error style: the config error every check raises (:class:`ConfigError`, torch-free;
:mod:`rankexp.config` re-exports it), and what Hydra and OmegaConf refuse while composing, as
rankexp's one line.

A key typo is refused by :func:`rankexp.config.check_override_keys` before Hydra runs
(``invalid config: unknown key 'deph' — did you mean 'depth'? keys: …``).  The other mistakes a
user can type are found by Hydra itself while it composes — a config-group choice that does not
exist (``norm=psot``, ``experiment=fig44``, ``size=smok``, ``task=trian``) and a value OmegaConf
cannot convert to the schema's type (``alpha=abc``, ``task.options.representation.n=abc``,
``tracking.force=ture``, ``activation=foo``) — and Hydra reports them in several lines (its
message, OmegaConf's, the search path, "Set the environment variable HYDRA_FULL_ERROR=1…").
:func:`one_line` turns Hydra's exception into the same one line as the key typo: the key, the
value, what is allowed and a suggestion — the closest allowed name (:mod:`difflib`) where the
allowed values have names, an example value (the composed one) where they are numbers.  What is
allowed comes from Hydra's exception itself (the group's options Hydra listed; the node type
OmegaConf refused to convert to), so the message and the check never disagree.

``HYDRA_FULL_ERROR=1`` keeps Hydra's own report and stack trace (:mod:`rankexp.cli`).
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Sequence
from typing import Any

from .config.schema import choices_with
from .knobs import ConfigError, bad  # noqa: F401  (re-exported)

#: how a leaf node's type reads in a message
_TYPES = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false",
          "StringNode": "a string", "BytesNode": "bytes", "PathNode": "a path"}


def one_line(e: BaseException) -> str | None:
    """The one-line message for a composition error Hydra raised, or None when ``e`` is not one.

    Args:
        e: an exception Hydra raised while composing (``MissingConfigException`` for a group
            choice that does not exist, ``ConfigCompositionException`` caused by OmegaConf's
            ``ValidationError`` for a value of the wrong type, ``OverrideParseException`` for an
            override Hydra cannot parse).

    Returns:
        ``invalid config: <key>=<value> — did you mean '<closest>'? allowed: …`` (the names,
        or ``an integer, e.g. <key>=4``); None for anything else.
    """
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, MissingConfigException):
        return _missing_choice(e)
    if isinstance(e, OverrideParseException):
        return _lines(f"invalid override {e.override!r}", str(e)) + \
            " (the override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"
    if isinstance(e, ConfigCompositionException):
        cause = e.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            return _mistyped(cause) or _not_a_key(cause) or _lines("invalid config", str(e), str(cause))
        return _lines("invalid config", str(e), str(cause or ""))
    return None


def _lines(what: str, *messages: str) -> str:
    """Hydra's message in one line: the lines that say what is wrong, without the search path,
    OmegaConf's node details and the HYDRA_FULL_ERROR advice."""
    skip = ("Config search path", "provider=", "full_key:", "object_type=", "reference_type=",
            "Set the environment variable", "See https://hydra.cc")
    lines = [ln.strip().rstrip(":") for m in messages for ln in m.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(skip)]
    return f"{what}: " + " — ".join(dict.fromkeys(lines))


def _missing_choice(e: Any) -> str | None:
    """``norm=psot``: Hydra names the missing ``group/choice`` and lists the group's options."""
    path = e.missing_cfg_file or ""
    group, _, value = path.rpartition("/")
    if not group or e.options is None:
        return _lines("invalid config", str(e))
    parent = re.match(r"In '([^']+)':", str(e))
    asked = "" if parent is None or parent[1] in ("config", "hydra/config") else \
        f" (asked for by conf/{parent[1]}.yaml)"
    return _message(group, value, sorted(e.options)) + asked


def _mistyped(cause: Any) -> str | None:
    """``alpha=abc``: OmegaConf could not convert the value to the node's type."""
    from omegaconf import ListConfig

    key, value, node = cause.full_key, cause.value, cause.child_node
    parent = cause.parent_node
    if node is None and isinstance(parent, ListConfig):  # task.lrs=[a]: an element
        element = getattr(parent._metadata.element_type, "__name__", "")
        what = {"int": "integers", "float": "numbers", "str": "strings", "bool": "true/false"}
        return (f"invalid config: {key}={value!r} — allowed in {key.rsplit('[', 1)[0]}: "
                f"{what.get(element, element or 'values')}")
    if node is None:
        return None
    optional = node._is_optional()
    if isinstance(node, ListConfig):
        return f"invalid config: {key}={value!r} — allowed: a list in brackets, {key}=[a,b]"
    ref = node._metadata.ref_type
    if isinstance(ref, type) and issubclass(ref, enum.Enum):
        names = [m.name for m in ref] + (["null"] if optional else [])
        return _message(key, value, names)
    kind = _TYPES.get(type(node).__name__)
    if kind is None:
        return None
    if value is None and not optional:
        return f"invalid config: {key}=null — allowed: {kind}, not null{_example(key, node)}"
    if kind == "true or false":
        return _message(key, value, ["true", "false"] + (["null"] if optional else []))
    return _message(key, value, ["null"] if optional else [],
                    f"{kind}{' or null' if optional else ''}{_example(key, node)}")


def _not_a_key(cause: Any) -> str | None:
    """``task.steps=5`` with task=measure: a key of the group's other choice (the key check
    before Hydra knows every choice's keys, not which one the config composes)."""
    import dataclasses

    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    kind = cause.object_type
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError) or not dataclasses.is_dataclass(kind):
        return None
    key, field = cause.full_key, cause.key
    group = key.rsplit(".", 1)[0]
    names = {f.name: f.default for f in dataclasses.fields(kind)}
    chosen, others = names.get("name"), choices_with(group, field)
    if not isinstance(chosen, str) or not others:
        return None
    return (f"invalid config: {key} — {group}={chosen} has no key '{field}', "
            f"{' and '.join(f'{group}={o}' for o in others)} has: add {group}={others[0]}")


def _example(key: str, node: Any) -> str:
    """``, e.g. alpha=1.0``: the value as composed (the default, or the experiment's)."""
    v = node._value()
    if v is None or (isinstance(v, str) and "${" in v):  # unset, or an interpolation
        return ""
    return f", e.g. {key}={str(v).lower() if isinstance(v, bool) else v}"


def _message(key: str, value: Any, names: Sequence[str], kind: str = "") -> str:
    """``invalid config: key='value' — did you mean 'x'? allowed: a, b, c`` — the named values
    (or ``kind``: what a number or string must be), a close name when :mod:`difflib` finds one."""
    close = difflib.get_close_matches(str(value), list(names), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"invalid config: {key}={value!r} — {hint}allowed: {kind or ', '.join(names)}"
