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
from typing import Iterable, Mapping, Optional

Key = tuple[str, int, int]  # (template, position, value)
_Parsed = tuple[str, tuple[int, ...]]  # (template, integers)


def is_index(part: str) -> bool:
    """An all-digit component, ASCII only: ``"²".isdigit()`` is true and ``int("²")`` raises; a checkpoint's names
    are any strings its header holds."""
    return part.isdigit() and part.isascii()


def parse(name: str) -> _Parsed:
    """``(template, integers)``: the name with each all-digit dot component replaced by ``#``, and those integers."""
    parts = name.split(".")
    ints = tuple(int(p) for p in parts if is_index(p))
    if not ints:
        return name, ints
    return ".".join("#" if is_index(p) else p for p in parts), ints


def _parse_all(names: Iterable[str]) -> dict[str, _Parsed]:
    """:func:`parse` of every name, each parsed once: ``name -> (template, integers)``.

    The names of a unit share everything up to their last integer (an expert's
    ``model.layers.5.mlp.experts.17`` before ``gate_proj.weight``): that head is parsed once and its
    two trailing components, when neither is an integer, are appended to its template.
    """
    out: dict[str, _Parsed] = {}
    heads: dict[str, _Parsed] = {}
    for name in names:
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and not is_index(parts[1]) and not is_index(parts[2]):
            head = heads.get(parts[0])
            if head is None:
                head = heads[parts[0]] = parse(parts[0])
            out[name] = (f"{head[0]}.{parts[1]}.{parts[2]}", head[1]) if head[1] else (name, ())
        else:
            out[name] = parse(name)
    return out


def _keys_of(template: str, ints: tuple[int, ...]) -> tuple[Key, ...]:
    """The (template, position, value) keys of a name parsed into ``template`` and ``ints``."""
    return tuple((template, position, value) for position, value in enumerate(ints))


def _by_place(keys: Iterable[Key]) -> dict[tuple[int, int], set[str]]:
    """``(position, value) -> templates`` of ``keys``."""
    out: dict[tuple[int, int], set[str]] = defaultdict(set)
    for template, position, value in keys:
        out[(position, value)].add(template)
    return out


class Sample:
    """The names of one checkpoint, each parsed once into its template and integers, and the rounds over them.

    ``parsed``: the names already parsed (:func:`parse_all`), to parse them once per question. The work after
    parsing is per unit (the names sharing one tuple of integers) and per template, not per name.
    """

    def __init__(self, names: Iterable[str], parsed: Optional[Mapping[str, _Parsed]] = None):
        self.names = list(names)
        self.parsed = parsed if parsed is not None else _parse_all(self.names)
        # unit (integers) -> its members and, aligned, their templates
        self.units: dict[tuple[int, ...], list[str]] = defaultdict(list)
        self._templates: dict[tuple[int, ...], list[str]] = defaultdict(list)
        self._sorted: Optional[list] = None
        units, templates = self.units, self._templates
        for name, (template, ints) in zip(self.names, map(self.parsed.__getitem__, self.names)):
            units[ints].append(name)
            templates[ints].append(template)

    def keys(self, name: str) -> tuple[Key, ...]:
        """The (template, position, value) keys of ``name``."""
        return _keys_of(*self.parsed[name])

    def ints(self, name: str) -> tuple[int, ...]:
        """The integers of ``name`` (its unit)."""
        found = self.parsed.get(name)
        return found[1] if found is not None else parse(name)[1]

    def _sorted_units(self) -> list[tuple[tuple[int, ...], list[str]]]:
        if self._sorted is None:
            self._sorted = sorted(self.units.items())
        return self._sorted

    def first_round(self) -> list[str]:
        """Every name with fewer than two integers, and units until every key occurred once."""
        fed: list[str] = []
        covered: dict[tuple[int, int], set[str]] = defaultdict(set)  # (position, value) -> templates seen there
        for ints, members in self._sorted_units():
            if len(ints) < 2:
                fed += members
                continue
            templates = set(self._templates[ints])
            places = [covered[place] for place in enumerate(ints)]
            if any(not templates <= seen for seen in places):
                for seen in places:
                    seen |= templates
                fed += members
        return fed

    def live(self, fed: Iterable[str], read: Iterable[str]) -> set[Key]:
        """The keys of the fed names the module read."""
        read = set(read)
        parsed = self.parsed
        return {key for name in fed if name in read for key in _keys_of(*parsed[name])}

    def second_round(self, fed: Iterable[str], read: Iterable[str]) -> list[str]:
        """Units that pair each key never read so far with keys that were: the next names to feed."""
        fed = set(fed)
        alive = self.live(fed, read)
        templates_read = {shape for shape, _, _ in alive}
        tried = {key for name in fed for key in self.keys(name)}
        doubtful = {key for key in tried if key not in alive and key[0] in templates_read}
        extra: list[str] = []
        if not doubtful:
            return extra
        # (position, value) -> templates: where a key is doubtful, where one was read
        doubt_at, alive_at = _by_place(doubtful), _by_place(alive)
        empty: frozenset = frozenset()
        for ints, members in self._sorted_units():
            if len(ints) < 2 or members[0] in fed:
                continue
            places = tuple(enumerate(ints))
            if not any(place in doubt_at for place in places):
                continue  # a unit hits only where one of its places holds a doubtful key
            templates = set(self._templates[ints])
            hits = []
            for index, place in enumerate(places):
                candidates = doubt_at.get(place)
                if not candidates:
                    continue
                candidates = candidates & templates  # its key doubtful, every other key of the template read
                for other, elsewhere in enumerate(places):
                    if other != index and candidates:
                        candidates = candidates & alive_at.get(elsewhere, empty)
                hits += [(place, template) for template in candidates]
            if hits:
                for place, template in hits:
                    doubt_at[place].discard(template)
                    if not doubt_at[place]:
                        del doubt_at[place]
                extra += members
                if not doubt_at:
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
            template, ints = self.parsed.get(name) or parse(name)
            if len(ints) >= 2:
                by_family[template.rsplit("#", 1)[0]].setdefault(template, name)
        missing: dict[str, str] = {}
        if not by_family:
            return missing
        family_of: dict[str, str] = {}
        for ints, members in self.units.items():
            if len(ints) < 2 or members[0] in fed:
                continue
            templates = set(self._templates[ints])
            families = set()
            for t in templates:
                family = family_of.get(t)
                if family is None:
                    family = family_of[t] = t.rsplit("#", 1)[0]
                families.add(family)
            for family in families:
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
        alive_at = _by_place(alive)  # a unit's names read: their templates alive at every one of its places
        empty: frozenset = frozenset()
        for ints, members in self.units.items():
            if len(ints) < 2:
                continue
            ok = None
            for place in enumerate(ints):
                there = alive_at.get(place, empty)
                ok = set(there) if ok is None else ok & there
                if not ok:
                    break
            if not ok:
                continue
            templates = self._templates[ints]
            out.update(name for name, template in zip(members, templates) if template in ok and name not in fed)
        return out
