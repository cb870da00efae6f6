"""Which checkpoint names a dry run must feed to answer for all of them: the per-expert names, sampled.

A large MoE checkpoint is mostly per-expert tensors: DeepSeek-V3 has 92k names, 89k of them
``model.layers.{L}.mlp.experts.{E}.{proj}.{weight,weight_scale_inv}``. Feeding them all to a
dry run costs the Python time of the engine's whole loading loop (over a minute there). A
``load_weights`` treats names of one *template* (the name with each all-digit dot component replaced by ``#``) by
their integers: which layers this pipeline stage holds, which experts this rank holds, which
MTP layers a draft builds. So:

- every name with at most one integer (layer-level tensors, embeddings, heads) is fed;
- of the names with two or more integers, whole *units* (all names sharing one tuple of
  integers: an expert's gate/up/down and their scales arrive together, as the loaders expect
  them) are fed until every (template, position, value) occurs once (:meth:`Sample.first_round`);
- a value that only ever came paired with values the module does not read (layer 5 with
  expert 200, which another rank holds) is tried again with values it does read
  (:meth:`Sample.second_round`);
- an unfed name is read when, for its template, each of its integers was read at its position
  (:meth:`Sample.infer`).

The answer is exact for modules that decide by layer and by expert independently (vLLM's and
SGLang's pipeline and expert placement do); the completeness check still guards every load.
Pure functions over names; :mod:`.module_reads` runs the dry runs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

Key = tuple[str, int, int]  # (template, position, value)


def parse(name: str) -> tuple[str, tuple[int, ...]]:
    """``(template, integers)``: the name with each all-digit dot component replaced by ``#``, and those integers."""
    parts = name.split(".")
    ints = tuple(int(p) for p in parts if p.isdigit())
    if not ints:
        return name, ints
    return ".".join("#" if p.isdigit() else p for p in parts), ints


class Sample:
    """The names of one checkpoint, each parsed once into its template and integers, and the rounds over them."""

    def __init__(self, names: Iterable[str]):
        self.names = list(names)
        self.keys: dict[str, tuple[Key, ...]] = {}
        self.units: dict[tuple[int, ...], list[str]] = defaultdict(list)
        for name in self.names:
            shape, ints = parse(name)
            self.keys[name] = tuple((shape, position, value) for position, value in enumerate(ints))
            self.units[ints].append(name)

    def first_round(self) -> list[str]:
        """Every name with fewer than two integers, and units until every key occurred once."""
        fed: list[str] = []
        covered: set[Key] = set()
        for ints, members in sorted(self.units.items()):
            if len(ints) < 2:
                fed += members
                continue
            keys = {key for name in members for key in self.keys[name]}
            if not keys <= covered:
                covered |= keys
                fed += members
        return fed

    def live(self, fed: Iterable[str], read: Iterable[str]) -> set[Key]:
        """The keys of the fed names the module read."""
        read = set(read)
        return {key for name in fed if name in read for key in self.keys[name]}

    def second_round(self, fed: Iterable[str], read: Iterable[str]) -> list[str]:
        """Units that pair each key never read so far with keys that were: the next names to feed."""
        fed = set(fed)
        alive = self.live(fed, read)
        templates_read = {shape for shape, _, _ in alive}
        tried = {key for name in fed for key in self.keys[name]}
        doubtful = {key for key in tried if key not in alive and key[0] in templates_read}
        extra: list[str] = []
        if not doubtful:
            return extra
        for ints, members in sorted(self.units.items()):
            if len(ints) < 2 or members[0] in fed:
                continue
            hits = set()
            for name in members:
                keys = self.keys[name]
                for index, key in enumerate(keys):
                    if key in doubtful and all(other in alive for other in keys[:index] + keys[index + 1 :]):
                        hits.add(key)
            if hits:
                doubtful -= hits
                extra += members
                if not doubtful:
                    break
        return extra

    def missing_members(self, fed: Iterable[str], stacked: Iterable[str]) -> dict[str, str]:
        """Names an unfed unit lacks that its fed peers have and that fill part of a parameter.

        ``stacked``: the fed names the module wrote into part of a parameter (an expert's ``up_proj`` into
        half of its ``w13`` rows). A unit of the same family (the template up to its last integer) that was
        not fed and lacks one of those templates would leave that part at its init values. Returns
        ``missing name -> a fed name of the same template`` (whose parameter it would have filled).
        """
        fed = set(fed)
        by_family: dict[str, dict[str, str]] = defaultdict(dict)  # family -> template -> a fed name of it
        for name in stacked:
            template, ints = parse(name)
            if len(ints) >= 2:
                by_family[template.rsplit("#", 1)[0]].setdefault(template, name)
        missing: dict[str, str] = {}
        for ints, members in self.units.items():
            if len(ints) < 2 or members[0] in fed:
                continue
            templates = {parse(name)[0] for name in members}
            for family in {t.rsplit("#", 1)[0] for t in templates}:
                for template, example in by_family.get(family, {}).items():
                    if template not in templates:
                        values = iter(ints)
                        name = ".".join(str(next(values)) if part == "#" else part for part in template.split("."))
                        missing[name] = example
        return missing

    def infer(self, fed: Iterable[str], read: Iterable[str]) -> set[str]:
        """Every name the module reads: the fed ones it read, and the others whose keys all were read."""
        fed = set(fed)
        read = set(read)
        alive = self.live(fed, read)
        out = {n for n in fed if n in read}
        for name in self.names:
            keys = self.keys[name]
            if name not in fed and len(keys) >= 2 and all(key in alive for key in keys):
                out.add(name)
        return out


__all__ = ["Sample", "parse"]
