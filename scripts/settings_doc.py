"""Documentation of the settings, rendered from :class:`RobustSettings` itself.

The example files under ``configs/`` and the table in ``docs/settings.md``
are generated from the model's fields (variable, type, range, default,
description), so they cannot say something the code does not do. After
changing a field, regenerate them::

    python scripts/settings_doc.py --write

``--check`` exits non-zero when a file differs from what the model renders
(the test suite does the same). The same field -> "what is allowed" text is
used in :class:`~mx_strategies.settings.ConfigurationError` messages.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


from mx_strategies.settings import CONFIG_FILE_ENV, RETIRED, RobustSettings
from mx_strategies.settings_errors import allowed_text

WIDTH = 79
ENV_EXAMPLE = Path("configs/robust.env.example")
TOML_EXAMPLE = Path("configs/robust.toml.example")
SETTINGS_DOC = Path("docs/settings.md")
# The table of the test that shows what each setting changes (``SHOWN_BY``), checked by that file itself.
SETTINGS_TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_settings.py"
REGENERATE = "python scripts/settings_doc.py --write"


@dataclass(frozen=True)
class SettingDoc:
    """What a user needs to know about one setting."""

    field: str
    env: str
    description: str
    allowed: str  # "an integer from 0 to 8", "one of fail, warn", ...
    default: Any  # the Python default (None = unset)
    who: str  # the operator who would set it, and why
    test: str  # the test that shows what it changes (tests/test_x.py::test_y)
    is_list: bool

    @property
    def default_env(self) -> str:
        """The default as written in the environment or a .env file."""
        value = self.default
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)
        return str(value)

    @property
    def default_toml(self) -> str:
        """The default as a TOML value (``""`` stands for unset)."""
        value = self.default
        if value is None:
            return '""'
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return repr(value)
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(json.dumps(str(item)) for item in value) + "]"
        return json.dumps(str(value))

    @property
    def default_text(self) -> str:
        """The default for people: ``unset``, ``(empty)`` or the .env spelling."""
        if self.default is None:
            return "unset"
        return self.default_env or "(empty)"


def shown_by() -> dict[str, str]:
    """tests/test_settings.py's ``SHOWN_BY``: each setting's variable -> the test that shows what it changes."""
    tree = ast.parse(SETTINGS_TESTS.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHOWN_BY" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{SETTINGS_TESTS} holds no SHOWN_BY table")


def setting_docs() -> list[SettingDoc]:
    """One :class:`SettingDoc` per field, in declaration order; what each allows is read from pydantic's schema."""
    properties = RobustSettings.model_json_schema()["properties"]
    tests = shown_by()
    docs = []
    for field, info in RobustSettings.model_fields.items():
        env = str(info.validation_alias)
        prop = properties[env]
        docs.append(
            SettingDoc(
                field=field,
                env=env,
                description=info.description or "",
                allowed=allowed_text(prop),
                default=info.get_default(call_default_factory=True),
                who=prop.get("who", ""),
                test=tests.get(env, ""),
                is_list=any(kind.get("type") == "array" for kind in prop.get("anyOf", [prop])),
            )
        )
    return docs


# -- renderers -----------------------------------------------------------------


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=WIDTH - 2, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def _header(title: str, how: str) -> list[str]:
    lines = [f"# {title}", "#"]
    lines += _comment(
        "Generated from mx_strategies/settings.py: edit the fields there, not this "
        "file (a test checks that they match), then run"
    )
    lines += [f"#   {REGENERATE}", "#"]
    lines += _comment(how)
    lines += ["#"]
    lines += _comment(
        "Every setting is commented out at its default, so this file as shipped changes "
        "nothing. Uncomment a line to set it. The environment wins over this file, and "
        "this file over the defaults. A key that is not listed here is an error."
    )
    return lines


def _block(doc: SettingDoc, allowed_suffix: str = "") -> list[str]:
    rule = f"# --- {doc.env} "
    lines = ["", rule + "-" * max(3, WIDTH - len(rule))]
    lines += _comment(doc.description)
    lines += _comment(f"Set it when: {doc.who}.")
    lines += _comment(f"Allowed: {doc.allowed}{allowed_suffix}.")
    lines += _comment(f"Default: {doc.default_text}.")
    return lines


def render_env() -> str:
    """``configs/robust.env.example``: every setting, .env syntax."""
    lines = _header(
        "mx-strategies settings for MX_STRATEGY=mx_strategies.robust (.env format).",
        f"Point {CONFIG_FILE_ENV} at a copy of this file. Lists are comma-separated; "
        "an empty value means unset.",
    )
    for doc in setting_docs():
        lines += _block(doc, ", comma-separated" if doc.is_list else "")
        lines.append(f"# {doc.env}={doc.default_env}")
    return "\n".join(lines) + "\n"


def render_toml() -> str:
    """``configs/robust.toml.example``: every setting, TOML syntax."""
    lines = _header(
        "mx-strategies settings for MX_STRATEGY=mx_strategies.robust (TOML format).",
        f"Point {CONFIG_FILE_ENV} at a copy of this file (a name ending in .toml, or "
        '.toml.example). Keys are the environment variable names, at the top level. Lists '
        'are TOML arrays (a comma-separated string works too); "" means unset.',
    )
    for doc in setting_docs():
        lines += _block(doc)
        lines.append(f"# {doc.env} = {doc.default_toml}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """``docs/settings.md``: how settings are read, and one row per setting."""
    lines = [
        "# Settings",
        "",
        f"<!-- Generated from mx_strategies/settings.py by `{REGENERATE}`; edit the fields there. -->",
        "",
        "`mx_strategies.robust` reads every setting below once per load, and once at "
        "activation so that a bad value stops the process before any model is loaded.",
        "",
        "Values come from, highest precedence first:",
        "",
        "1. the environment;",
        f"2. the file named by `{CONFIG_FILE_ENV}`: a `.env` file, or TOML when the name ends "
        "in `.toml` (or `.toml.example`), with the variable names below as keys;",
        "3. the defaults below.",
        "",
        "Annotated examples of both file formats, every setting commented out at its default: "
        f"[`{ENV_EXAMPLE}`](../{ENV_EXAMPLE}) and [`{TOML_EXAMPLE}`](../{TOML_EXAMPLE}).",
        "",
        "```sh",
        f"cp {TOML_EXAMPLE} /etc/mx/robust.toml   # uncomment and edit what you need",
        f"export {CONFIG_FILE_ENV}=/etc/mx/robust.toml",
        "export MX_STRATEGY=mx_strategies.robust",
        "```",
        "",
        "An invalid value fails with one message naming the variable, its value and what it "
        "accepts, for example `MX_ROBUST_COMPLETENESS='maybe' is invalid: Input should be "
        "'fail' or 'warn'`. A file key that is not a setting, and a config file that does "
        "not exist, are errors too. Lists are comma-separated in the environment and in "
        '`.env` files, arrays in TOML; an empty value (`VAR=`, `""` in TOML) of a setting '
        "whose default is unset means unset.",
        "",
        "Each setting says who would set it, and names the test that shows what it changes.",
        "",
        "| Variable | Allowed | Default | Set it when | Description | Shown by |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for doc in setting_docs():
        lines.append(
            f"| `{doc.env}` | {_cell(doc.allowed)} | `{_cell(doc.default_text)}` | {_cell(doc.who)} "
            f"| {_cell(doc.description)} | `{doc.test}` |"
        )
    lines += ["", "## Retired settings", "",
              "These variables are no longer read. One still set logs one warning naming it and what replaced it, "
              "and changes nothing; unset it.", ""]  # fmt: skip
    lines += [f"- `{name}`: {replacement}." for name, replacement in RETIRED.items()]
    return "\n".join(lines) + "\n"


def rendered_files() -> dict[Path, str]:
    """Every generated file (relative to the repository root) and its text."""
    return {ENV_EXAMPLE: render_env(), TOML_EXAMPLE: render_toml(), SETTINGS_DOC: render_markdown()}


def stale_files(root: Path) -> list[Path]:
    """The generated files under ``root`` that differ from what the model renders."""
    stale = []
    for relative, text in rendered_files().items():
        path = root / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(relative)
    return stale


def _default_root() -> Path:
    """The checkout this module lives in, else the working directory."""
    checkout = Path(__file__).resolve().parents[1]
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/settings_doc.py", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="regenerate the example files and docs/settings.md")
    action.add_argument("--check", action="store_true", help="exit 1 when a generated file is out of date")
    parser.add_argument("--root", type=Path, default=None, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root = args.root or _default_root()
    if args.write:
        for relative, text in rendered_files().items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    if args.check:
        stale = stale_files(root)
        for relative in stale:
            print(f"{root / relative} is out of date; run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(render_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
