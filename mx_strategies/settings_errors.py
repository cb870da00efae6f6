"""What a setting accepts, in words, and the one message a bad configuration fails with.

A deployment with a bad value must fail at activation with a line the operator can act on: the variable, the
value, what is wrong and what is allowed. pydantic already says what is wrong (its ``msg``); what a variable
accepts is read from pydantic's own JSON schema of the settings (type, bounds, choices), so the text in an error,
in docs/settings.md and in the example files is the same and cannot drift from the validation.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from pydantic import ValidationError

_BOOL = "true or false; 1/0, yes/no, on/off also work"


def _bounds(schema: dict[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    limits = [f"> {schema['exclusiveMinimum']}"] if "exclusiveMinimum" in schema else []
    limits += [f">= {low}"] if low is not None else []
    limits += [f"<= {high}"] if high is not None else []
    return " " + " and ".join(limits) if limits else ""


def allowed_text(prop: dict[str, Any]) -> str:
    """What one variable accepts, from its property in pydantic's JSON schema of the settings."""
    kinds = [kind for kind in prop.get("anyOf", [prop]) if kind.get("type") != "null"]
    schema = kinds[0]
    items = schema.get("items", {})
    if "allowed" in prop:  # a field whose validator says more than its type (MX_MODEL_URI)
        text = prop["allowed"]
    elif "enum" in schema:
        text = "one of " + ", ".join(schema["enum"])
    elif "enum" in items:
        text = "one or more of " + ", ".join(items["enum"]) + ", each at most once"
    elif schema.get("type") == "array":
        text = "a list of strings, possibly empty"
    elif schema.get("type") in ("integer", "number"):
        text = ("an integer" if schema["type"] == "integer" else "a number") + _bounds(schema)
    elif schema.get("format") == "path":
        text = "a folder path"
    else:
        text = {"boolean": _BOOL, "string": "a string"}[schema["type"]]
    return text + (", or empty for unset" if len(kinds) < len(prop.get("anyOf", [prop])) else "")


def invalid_text(exc: ValidationError, properties: dict[str, dict[str, Any]]) -> str:
    """One message for every invalid value: ``VAR='value' is invalid: what is wrong (allowed: ...)``."""
    problems = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] != "literal_error" and name in properties:  # a literal's message lists the choices
            message += f" (allowed: {allowed_text(properties[name])})"
        problems.append(f"{name}={error.get('input')!r} is invalid: {message}")
    return "; ".join(problems)


def unknown_text(unknown: Iterable[str], names: set[str], prefix: str) -> list[str]:
    """``VAR is not a setting (did you mean ...?)`` for each variable with our prefix that is no setting."""
    # Compare what follows the shared prefix, or every name looks alike.
    tails = {name[len(prefix) :]: name for name in names if name.startswith(prefix)}
    problems = []
    for var in sorted(unknown):
        close = difflib.get_close_matches(var[len(prefix) :], sorted(tails), n=1, cutoff=0.6)
        hint = f"did you mean {tails[close[0]]}?" if close else f"the settings are {', '.join(sorted(names))}"
        problems.append(f"{var} is not a setting ({hint})")
    return problems
