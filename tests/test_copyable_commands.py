"""Every command a user can copy from the documentation works (issue 56).

The pages (README.md, docs/*.md) and the examples (every file under configs/)
show two kinds of command this package owns:

* installs: ``pip install ...``, ``python -m pip install ...``, ``uv pip
  install ...``. mx-strategies is not on the package index, so one that
  installs it must install the clone (``.``, ``'.[gcs,azure]'``, ``-e .``, a
  path to a checkout) or what ``scripts/build-dist.sh`` builds
  (``dist/mx_strategies-<version>-py3-none-any.whl`` or the sdist, with
  pyproject.toml's version, or a ``*`` glob matching it), never the name
  ``mx-strategies``; every extra it names must be one of
  pyproject.toml's optional-dependencies. Installs of other packages
  (``'modelexpress[metrics]'``, the test shim) are collected and left alone.
* ``mx-strategies ...`` and ``python -m mx_strategies[.cli] ...``: the words
  after the command must parse with the real command's parser
  (``mx_strategies.cli.build_parser``), without running anything, and name a
  subcommand (or be ``--help``/``--version``); ``python -m`` must name a
  module that runs as a program.

Where commands are read from: in the pages, fenced code blocks (each line of
any block, with ``\\`` continuations joined) and inline code spans; in configs/, YAML
``command:``/``args:`` lists (a ``sh -c`` string is read as shell), inline code
spans in comments, and comment lines written as commands (indented two spaces
or more after the ``#``, or starting ``RUN``/``$``), so that prose such as
``# mx-strategies settings for ...`` is not taken for a command. A line is cut
into commands at unquoted ``&&``, ``||``, ``;`` and ``|``; comments,
redirections and leading ``VAR=value`` assignments are dropped; a
``bash -c '...'`` string is read as the commands it holds. An ``mx-strategies``
whose first word ends in ``:`` is a message the command prints, not a command.
Placeholders (``<uri>``, ``...``, ``s3://models/GLM-5.2``) are fine as values.

Each failure names the file, the line and the command. The collector and the
checker are tested on small inputs too (``pip install mx-strategies`` and an
unknown flag must be flagged), and on the real files the collector must find a
minimum number of each kind of command, so a broken collector cannot pass.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mx_strategies.cli import build_parser
from test_docs import FENCE, REPO, fenced, pages

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIGS = REPO / "configs"
PACKAGE = "mx-strategies"
# The collector found 25 installs and 63 invocations when this test was written (README, docs/ and configs/,
# issue 56). Far fewer means the collector broke; if the pages really lost commands, lower these.
MIN_INSTALLS = 20
MIN_INVOCATIONS = 50

# pip's and uv's install options that take a value as the next word (``--opt=value`` takes none).
INSTALL_OPTIONS_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "--build-constraint", "-t", "--target", "--prefix", "--root",
    "--report", "-i", "--index-url", "--extra-index-url", "--index", "--default-index", "-f", "--find-links",
    "--python", "-p", "--platform", "--python-version", "--implementation", "--abi", "--src", "--upgrade-strategy",
    "--progress-bar", "-C", "--config-settings", "--config-setting", "--global-option", "--no-binary",
    "--only-binary", "--prerelease", "--resolution", "--index-strategy", "--cache-dir", "--log", "--exists-action",
    "--trusted-host", "--cert", "--client-cert", "--proxy", "--retries", "--timeout", "--keyring-provider",
    "--extra", "--group", "--link-mode", "--reinstall-package", "--upgrade-package", "-P", "--exclude-newer",
    "--overrides", "--torch-backend",
}  # fmt: skip
INSTALL_EDITABLE = {"-e", "--editable"}

ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Words in front of a command that leave it the command: a prompt, a Dockerfile RUN, wrappers.
PREFIX_WORDS = {"$", "RUN", "sudo", "exec", "env", "time", "command", "nohup"}
PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$|^\"?\$\{?PY(?:THON)?\}?\"?$")
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "zsh"}
REDIRECT_OPERATOR = re.compile(r"^(?:\d*|&)(?:>>?|<)(?:&\d*-?)?$")  # >, 2>, >>, <, 2>&1, &>
REDIRECT_INLINE = re.compile(r"^(?:\d*|&)(?:>>?|<)\S+$")  # >out.json, 2>/dev/null (not <placeholder>)
PLACEHOLDER = re.compile(r"^<[^<>]+>$")
INLINE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.DOTALL)  # a code span does not cross a blank line
COMMENT_COMMAND = re.compile(r"^#(?: {2,}|\s*(?=RUN |\$ ))(?P<text>.*)$")
REQUIREMENT = re.compile(r"^(?P<base>[^\[<>=!~;@ ]+)(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>.*)$")


@dataclass(frozen=True)
class Command:
    """One command a reader can copy: where it is, its text, and its words after the program."""

    where: str  # "docs/engines.md:14"
    text: str  # the command as collected, for the message
    kind: str  # "install" or "invocation"
    args: tuple[str, ...]  # install: the words after `install`; invocation: the words after the program
    program: str = PACKAGE  # invocation: "mx-strategies" or "python -m <module>"

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# -- reading shell text --------------------------------------------------------


def _segments(text: str) -> list[str]:
    """``text`` cut at unquoted ``&&``, ``||``, ``;`` and ``|``, without its comment.

    A quote left open (an apostrophe in prose, a span cut out of a ``bash -c
    '...'``) ends the text where it opened.
    """
    bounds, begin, quote, opened, i = [], 0, None, 0, 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                i += 1
        elif char in "'\"":
            quote, opened = char, i
        elif char == "\\":
            i += 1
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            break  # a comment
        elif char in ";|" or text[i : i + 2] == "&&":
            bounds.append((begin, i))
            i += 2 if text[i : i + 2] in ("&&", "||") else 1
            begin = i
            continue
        i += 1
    if quote:
        return _segments(text[:opened])
    bounds.append((begin, i))
    return [text[a:b].strip() for a, b in bounds if text[a:b].strip()]


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return []


def _without_redirections(words: list[str]) -> list[str]:
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif REDIRECT_OPERATOR.match(word):
            skip = "&" not in word[1:]  # `2>&1` names no file; `> out` does
        elif REDIRECT_INLINE.match(word) and not PLACEHOLDER.match(word):
            pass
        else:
            kept.append(word)
    return kept


def commands_in_words(words: list[str], where: str, text: str) -> list[Command]:
    """The commands one simple command (its words, already split) holds."""
    words = _without_redirections(words)
    while words and (ENV_ASSIGNMENT.match(words[0]) or words[0] in PREFIX_WORDS):
        words = words[1:]
    if not words:
        return []
    if words[0] in SHELLS and "-c" in words[1:-1]:
        return commands_in_shell(words[words.index("-c") + 1], where)
    if words[0] in ("docker", "podman", "kubectl"):  # `docker run IMAGE bash -c '...'`, `... IMAGE mx-strategies ...`
        for i, word in enumerate(words[1:], 1):
            if word in SHELLS and words[i + 1 : i + 2] == ["-c"] or word in (PACKAGE, "pip", "pip3", "uv") or (
                PYTHON.match(word) and words[i + 1 : i + 2] == ["-m"]
            ):
                return commands_in_words(words[i:], where, text)
        return []
    if words[0] in ("pip", "pip3") and words[1:2] == ["install"]:
        return [Command(where, text, "install", tuple(words[2:]))]
    if words[0] == "uv" and words[1:3] == ["pip", "install"]:
        return [Command(where, text, "install", tuple(words[3:]))]
    if PYTHON.match(words[0]) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if module == "pip" and words[3:4] == ["install"]:
            return [Command(where, text, "install", tuple(words[4:]))]
        if module in ("mx_strategies", "mx_strategies.cli"):
            return [Command(where, text, "invocation", tuple(words[3:]), program=f"python -m {module}")]
        return []
    if words[0] == PACKAGE and len(words) > 1 and not words[1].endswith(":"):
        return [Command(where, text, "invocation", tuple(words[1:]))]
    return []


def commands_in_shell(text: str, where: str) -> list[Command]:
    """The commands in one line of shell (continuations joined)."""
    found = []
    for segment in _segments(text):
        found += commands_in_words(_words(segment), where, segment)
    return found


# -- reading the files ---------------------------------------------------------


def _fenced_lines(lines: list[str]) -> list[tuple[int, str]]:
    """``(line number, text)`` of each line inside fenced blocks, ``\\`` continuations joined."""
    found, pending, start = [], "", 0
    for number, line, inside in fenced(lines):
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        found.append((start, pending + line))
        pending = ""
    return found


def _inline_spans(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """``(line number, code)`` of each inline code span in ``text`` (a span may cross one line end)."""
    return [
        (first_line + text.count("\n", 0, match.start()), " ".join(match.group(2).split()))
        for match in INLINE_SPAN.finditer(text)
    ]


def markdown_commands(path: Path) -> list[Command]:
    lines = path.read_text(encoding="utf-8").splitlines()
    name = path.relative_to(REPO).as_posix()
    found = []
    for number, line in _fenced_lines(lines):
        found += commands_in_shell(line, f"{name}:{number}")
    # Inline code outside the fences: the fenced lines are blanked, so line numbers stay right.
    blanked, fence = [], None
    for line in lines:
        match = FENCE.match(line)
        if match:
            fence = match.group(1) if fence is None else (None if match.group(1) == fence else fence)
            blanked.append("")
        else:
            blanked.append("" if fence else line)
    for number, code in _inline_spans("\n".join(blanked)):
        found += commands_in_shell(code, f"{name}:{number}")
    return found


def _yaml_argvs(node: yaml.Node) -> list[tuple[int, list[str]]]:
    """``(line, argv)`` of each mapping's ``command`` + ``args`` lists in a composed YAML document."""
    found = []
    if isinstance(node, yaml.MappingNode):
        values = {key.value: value for key, value in node.value if isinstance(key, yaml.ScalarNode)}
        argv, line = [], None
        for key in ("command", "args"):
            value = values.get(key)
            if isinstance(value, yaml.SequenceNode):
                argv += [item.value for item in value.value if isinstance(item, yaml.ScalarNode)]
            elif isinstance(value, yaml.ScalarNode):
                argv += [value.value]
            if value is not None and line is None:
                line = value.start_mark.line + 1
        if argv and "command" in values:  # args alone go to the image's entry point (vllm serve here)
            found.append((line, argv))
        for _, value in node.value:
            found += _yaml_argvs(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found += _yaml_argvs(item)
    return found


def config_commands(path: Path) -> list[Command]:
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(REPO).as_posix()
    lines = text.splitlines()
    found = []
    # Comments: inline code spans, and lines written as commands (continuations joined).
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped.startswith("#"):
            pending = ""
            continue
        for n, code in _inline_spans(stripped[1:], number):
            found += commands_in_shell(code, f"{name}:{n}")
        match = COMMENT_COMMAND.match(stripped)
        body = match.group("text") if match else None
        if body is None and not pending:
            continue
        body = stripped[1:] if body is None else body
        body = INLINE_SPAN.sub("CODE", body)  # the spans were read above
        if not pending:
            start = number
        if body.rstrip().endswith("\\"):
            pending += body.rstrip()[:-1] + " "
            continue
        found += commands_in_shell(pending + body, f"{name}:{start}")
        pending = ""
    if path.suffix in (".yaml", ".yml"):
        for document in yaml.compose_all(text):
            for number, argv in _yaml_argvs(document):
                found += commands_in_words(argv, f"{name}:{number}", shlex.join(argv))
    return found


def sources() -> list[Path]:
    return [*pages(), *sorted(p for p in CONFIGS.rglob("*") if p.is_file())]


def collect(paths: list[Path] | None = None) -> list[Command]:
    found = []
    for path in sources() if paths is None else paths:
        found += markdown_commands(path) if path.suffix == ".md" else config_commands(path)
    return found


# -- checking ------------------------------------------------------------------


def project() -> dict:
    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_path(base: str) -> bool:
    return base in (".", "..") or base.startswith(("./", "../", "/", "~", "file:", "$")) or "/" in base or (
        base.endswith((".whl", ".tar.gz", ".zip"))
    )


def install_problems(command: Command, version: str, extras: set[str]) -> list[str]:
    """Why an install line cannot install mx-strategies as written; empty when it can, or installs other things."""
    targets, skip = [], False
    words = list(command.args)
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in INSTALL_EDITABLE:
            targets.append(words[i + 1] if i + 1 < len(words) else "")
            skip = True
        elif word in INSTALL_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            targets.append(word)
    problems = []
    for target in targets:
        match = REQUIREMENT.match(target)
        if not match:
            continue
        base, named = match.group("base"), match.group("extras")
        if match.group("rest").startswith("@"):
            continue  # a direct reference, `mx-strategies @ file:///...`: not from the index
        filename = base.rstrip("/").rsplit("/", 1)[-1]
        if not _is_path(base):
            if _normalized(base) == PACKAGE:
                problems.append(
                    f"installs {target!r} by name from the package index, where {PACKAGE} is not published: "
                    f"install the clone (pip install .) or the wheel (pip install "
                    f"dist/mx_strategies-{version}-py3-none-any.whl)"
                )
            continue
        if base.rstrip("/") in (".", "..", "") or _normalized(filename).startswith(PACKAGE):
            pass  # the clone, or a checkout, wheel or sdist of this package
        else:
            continue  # another package's path (the test shim)
        if filename.endswith((".whl", ".tar.gz", ".zip")):
            built = {f"mx_strategies-{version}-py3-none-any.whl", f"mx_strategies-{version}.tar.gz"}
            if not any(fnmatch.fnmatchcase(name, filename) for name in built):
                problems.append(
                    f"installs {filename}, which is not what scripts/build-dist.sh builds from pyproject.toml's "
                    f"version {version} ({' or '.join(sorted(built))})"
                )
        for extra in filter(None, (e.strip() for e in (named or "").split(","))):
            if _normalized(extra) not in {_normalized(e) for e in extras}:
                problems.append(f"names the extra [{extra}], which pyproject.toml does not define ({', '.join(sorted(extras))})")
    return problems


def invocation_problems(command: Command) -> list[str]:
    """Why the words of an ``mx-strategies`` or ``python -m`` invocation do not parse; empty when they do."""
    problems = []
    if command.program.startswith("python -m "):
        module = command.program.split()[-1]
        spec = importlib.util.find_spec(module)
        runs = spec is not None and (
            spec.submodule_search_locations is None or importlib.util.find_spec(f"{module}.__main__") is not None
        )
        if not runs:
            problems.append(f"{module} cannot be run with python -m (no {module}.__main__)")
    said_out, said_err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(said_out), contextlib.redirect_stderr(said_err):
            parsed = build_parser().parse_args(list(command.args))
    except SystemExit as exc:
        if exc.code not in (0, None):
            lines = [line for line in said_err.getvalue().splitlines() if line.strip()]
            problems.append(lines[-1] if lines else f"the parser exited {exc.code}")
        return problems
    if getattr(parsed, "handler", None) is None:
        problems.append("names no subcommand (mx-strategies: error: choose a command)")
    return problems


def problems(commands: list[Command]) -> list[str]:
    meta = project()
    version, extras = meta["version"], set(meta.get("optional-dependencies", {}))
    found = []
    for command in commands:
        why = install_problems(command, version, extras) if command.kind == "install" else invocation_problems(command)
        found += [f"{command}: {reason}" for reason in why]
    return found


# -- the collector and checker, on small inputs --------------------------------


def _write(tmp_path: Path, name: str, text: str) -> Path:
    # Under REPO's layout so relative_to(REPO) works: a folder in tmp_path stands for the repository.
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _collect_text(monkeypatch, tmp_path, name: str, text: str) -> list[Command]:
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    return collect([_write(tmp_path, name, text)])


def test_shell_lines_are_cut_into_commands():
    found = commands_in_shell(
        "MX_MODEL_URI=s3://b/m mx-strategies doctor --json > doctor.json 2>&1 || exit_code=$?  # a comment", "x:1"
    )
    assert [(c.kind, c.args) for c in found] == [("invocation", ("doctor", "--json"))]
    found = commands_in_shell("docker run --rm -v \"$PWD:/src\" img bash -c 'pip install -q \".[demo]\" && scripts/x.sh'", "x:2")
    assert [(c.kind, c.args) for c in found] == [("install", ("-q", ".[demo]"))]
    found = commands_in_shell('"$PY" -m mx_strategies.cli demo --engine vllm | tee log', "x:3")
    assert [(c.program, c.args) for c in found] == [("python -m mx_strategies.cli", ("demo", "--engine", "vllm"))]
    assert commands_in_shell("mx-strategies doctor: could not ask the module: <role> (<class>): <why>", "x:4") == []
    assert commands_in_shell("git clone <this repository> mx-strategies && cd mx-strategies", "x:5") == []
    assert commands_in_shell("pip install --dry-run --report - mx-strategies", "x:6")[0].args[-1] == "mx-strategies"


def test_the_collector_reads_pages_and_configs(monkeypatch, tmp_path):
    page = (
        "# Page\n\nRun `mx-strategies doctor <uri>` or `pip install\n'.[gcs]'` (a span across a line end).\n\n"
        "```sh\n# a comment\npip install mx-strategies   # not this\nmx-strategies demo --engine vllm \\\n"
        "  --arch deepseek_v3\n```\n\nThe `mx-strategies` command. Prose: mx-strategies doctor --bogus.\n"
    )
    found = _collect_text(monkeypatch, tmp_path, "docs/page.md", page)
    assert [(c.where, c.kind, c.args) for c in found] == [
        ("docs/page.md:8", "install", ("mx-strategies",)),
        ("docs/page.md:9", "invocation", ("demo", "--engine", "vllm", "--arch", "deepseek_v3")),
        ("docs/page.md:3", "invocation", ("doctor", "<uri>")),
        ("docs/page.md:3", "install", (".[gcs]",)),
    ]
    config = (
        "# mx-strategies settings for the robust strategy (prose, not a command).\n"
        "#   FROM image\n#   RUN pip install --no-cache-dir mx-strategies    # keeps ModelExpress\n"
        "# An image with `pip install 'mx-strategies[gcs]'`.\n"
        "#   docker run --env-file x.env \\\n#     img mx-strategies doctor --nope\n"
        "spec:\n  initContainers:\n    - name: a\n      command: [\"mx-strategies\", \"plugin\", \"--write\", \"/p\"]\n"
        "    - name: b\n      command: [\"sh\", \"-c\"]\n      args: [\"pip install /wheels/mx_strategies-9.9-py3-none-any.whl\"]\n"
    )
    found = _collect_text(monkeypatch, tmp_path, "configs/k8s/x.yaml", config)
    assert [(c.where, c.kind, c.args) for c in found] == [
        ("configs/k8s/x.yaml:3", "install", ("--no-cache-dir", "mx-strategies")),
        ("configs/k8s/x.yaml:4", "install", ("mx-strategies[gcs]",)),
        ("configs/k8s/x.yaml:5", "invocation", ("doctor", "--nope")),
        ("configs/k8s/x.yaml:10", "invocation", ("plugin", "--write", "/p")),
        ("configs/k8s/x.yaml:12", "install", ("/wheels/mx_strategies-9.9-py3-none-any.whl",)),
    ]


def test_the_checker_flags_what_cannot_work():
    version = project()["version"]
    bad = [
        Command("a.md:1", "pip install mx-strategies", "install", ("mx-strategies",)),
        Command("a.md:2", "uv pip install 'mx_strategies[gcs]'", "install", ("mx_strategies[gcs]",)),
        Command("a.md:3", "pip install '.[nope]'", "install", (".[nope]",)),
        Command("a.md:4", "pip install dist/mx_strategies-0.0.1-...", "install", ("dist/mx_strategies-0.0.1-py3-none-any.whl",)),
        Command("a.md:4b", "pip install mx_strategies.whl", "install", (f"/tmp/mx_strategies-{version}.whl",)),
        Command("a.md:5", "mx-strategies doctor --bogus", "invocation", ("doctor", "--bogus")),
        Command("a.md:6", "mx-strategies check x", "invocation", ("check", "x")),
        Command("a.md:7", "mx-strategies --json", "invocation", ("--json",)),
        Command("a.md:8", "mx-strategies demo --arch nope", "invocation", ("demo", "--arch", "nope")),
        Command("a.md:9", "python -m mx_strategies doctor x", "invocation", ("doctor", "x"), "python -m mx_strategies"),
    ]
    found = problems(bad)
    for command in bad:
        assert any(line.startswith(f"{command.where}: {command.text}: ") for line in found), (command, found)
    assert "unrecognized arguments: --bogus" in "\n".join(found)
    good = [
        Command("b.md:1", "pip install .", "install", (".",)),
        Command("b.md:2", "pip install -e '.[bench]'", "install", ("-e", ".[bench]")),
        Command("b.md:3", "pip install wheel", "install", (f"dist/mx_strategies-{version}-py3-none-any.whl[gcs,azure]",)),
        Command("b.md:4", "pip install /path/to/mx-strategies[demo]", "install", ("/path/to/mx-strategies[demo]",)),
        Command("b.md:5", "pip install glob", "install", ("dist/mx_strategies-*.whl",)),
        Command("b.md:5b", "pip install sdist", "install", (f"mx_strategies-{version}.tar.gz",)),
        Command("b.md:6", "pip install 'modelexpress[metrics]'", "install", ("modelexpress[metrics]",)),
        Command("b.md:7", "pip install --report - .", "install", ("--dry-run", "--report", "-", ".")),
        Command("b.md:8", "mx-strategies doctor <uri> --engine sglang", "invocation", ("doctor", "<uri>", "--engine", "sglang")),
        Command("b.md:9", "mx-strategies --version", "invocation", ("--version",)),
        Command("b.md:10", "python -m mx_strategies.cli demo", "invocation", ("demo",), "python -m mx_strategies.cli"),
    ]
    assert problems(good) == []


# -- the real pages and configs ------------------------------------------------


def test_the_collector_finds_the_commands():
    found = collect()
    installs = [c for c in found if c.kind == "install"]
    invocations = [c for c in found if c.kind == "invocation"]
    assert len(installs) >= MIN_INSTALLS, "\n".join(map(str, installs))
    assert len(invocations) >= MIN_INVOCATIONS, "\n".join(map(str, invocations))
    where = {c.where.split(":")[0] for c in found}
    assert {"README.md", "docs/install.md", "configs/k8s/vllm-mtp-s3-modelexpress-08.yaml"} <= where


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_works(path):
    found = problems(collect([path]))
    assert not found, "commands a reader copies that cannot work as written:\n" + "\n".join(found)
