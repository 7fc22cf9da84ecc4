"""Templating of case models: ``$name`` variables (a list of integers renders as shape dims) and
``@{template}`` includes, expanded into protobuf text."""

from __future__ import annotations

import re
import string
from typing import Any

from conformance.adapters.base import SuiteError


def substitute(obj: Any, variables: dict) -> Any:
    if isinstance(obj, str):
        return string.Template(obj).safe_substitute({k: str(v) for k, v in variables.items()})
    if isinstance(obj, list):
        return [substitute(item, variables) for item in obj]
    if isinstance(obj, dict):
        return {key: substitute(item, variables) for key, item in obj.items()}
    return obj


def expand_template(template: str, variables: dict, templates: dict, where: str, depth: int = 0) -> str:
    """``$name`` from vars, then ``@{template}`` includes (in templates or in variable values)."""
    if depth > 8:
        raise SuiteError(f"{where}: templates include each other too deeply")
    try:
        text = string.Template(template).substitute({k: render_var(v) for k, v in variables.items()})
    except (KeyError, ValueError) as error:
        raise SuiteError(f"{where}: template variable {error} is not set") from None

    def include(match: re.Match) -> str:
        inner = templates.get(match.group(1))
        if inner is None:
            raise SuiteError(f"{where}: unknown included template {match.group(1)!r}")
        if isinstance(inner, dict):
            inner = inner["text"]
        return expand_template(inner, variables, templates, where, depth + 1)

    return re.sub(r"@\{(\w+)\}", include, text)


def render_var(value: Any) -> str:
    """Template values: a list of integers renders as tensor shape dims, anything else as text."""
    if isinstance(value, list) and all(isinstance(d, int) for d in value):
        return " ".join(f"dim {{ dim_value: {d} }}" for d in value)
    return str(value)
