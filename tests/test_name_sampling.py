"""mx_strategies.select.name_sampling on DeepSeek-V3's naming: the units a sampled dry run feeds, and the members an
unfed unit lacks (pure functions over names)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from mx_strategies.select.name_sampling import Key, Sample, parse, _parse_all


def expert_names(layers, experts, leave_out=()):
    names = [f"model.layers.{layer}.self_attn.q_a_proj.weight" for layer in layers]
    for layer in layers:
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                if name not in leave_out:
                    names.append(name)
    return names


def test_an_unfed_expert_that_lacks_a_stacked_member_is_named():
    missing = "model.layers.7.mlp.experts.5.up_proj.weight"
    sample = Sample(expert_names(range(3, 8), 8, leave_out={missing}))
    fed = sample.first_round()
    assert missing.replace(".up_proj.", ".gate_proj.") not in fed  # expert 5 of layer 7: no round fed it
    stacked = [n for n in fed if n.endswith(("gate_proj.weight", "up_proj.weight"))]  # what fills part of w13
    assert sample.missing_members(fed, stacked) == {missing: "model.layers.3.mlp.experts.0.up_proj.weight"}


def test_a_complete_checkpoint_lacks_nothing_and_only_templates_written_in_part_are_asked_about():
    sample = Sample(expert_names(range(3, 8), 8))
    fed = sample.first_round()
    assert sample.missing_members(fed, [n for n in fed if "_proj" in n]) == {}
    lacking = Sample(expert_names(range(3, 8), 8, leave_out={"model.layers.6.mlp.experts.2.down_proj.weight"}))
    # Only the templates the module wrote into part of a parameter are asked about (here: not down_proj).
    assert lacking.missing_members(lacking.first_round(), [n for n in fed if "gate_proj" in n or "up_proj" in n]) == {}


# The sampler as it was before names were parsed once per question (2026-12-03): the oracle the faster one must
# match name for name.
def reference_parse(name: str) -> tuple[str, tuple[int, ...]]:
    """``(template, integers)``: the name with each all-digit dot component replaced by ``#``, and those integers."""
    parts = name.split(".")
    ints = tuple(int(p) for p in parts if p.isdigit())
    if not ints:
        return name, ints
    return ".".join("#" if p.isdigit() else p for p in parts), ints


class ReferenceSample:
    """The names of one checkpoint, each parsed once into its template and integers, and the rounds over them."""

    def __init__(self, names: Iterable[str]):
        self.names = list(names)
        self.keys: dict[str, tuple[Key, ...]] = {}
        self.units: dict[tuple[int, ...], list[str]] = defaultdict(list)
        for name in self.names:
            shape, ints = reference_parse(name)
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
            template, ints = reference_parse(name)
            if len(ints) >= 2:
                by_family[template.rsplit("#", 1)[0]].setdefault(template, name)
        missing: dict[str, str] = {}
        for ints, members in self.units.items():
            if len(ints) < 2 or members[0] in fed:
                continue
            templates = {reference_parse(name)[0] for name in members}
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


def _random_names(rng):
    names = []
    layers = rng.sample(range(0, 70), rng.randint(1, 6))
    experts = rng.randint(1, 9)
    for layer in layers:
        names.append(f"model.layers.{layer}.input_layernorm.weight")
        names.append(f"model.layers.{layer}.self_attn.q_a_proj.weight_scale_inv")
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj", "w13", "w2"):
                for leaf in ("weight", "weight_scale_inv", "0", "a.1"):
                    if rng.random() < 0.5:
                        names.append(f"model.layers.{layer}.mlp.experts.{expert}.{proj}.{leaf}")
            if rng.random() < 0.2:
                names.append(f"{layer}.odd..{expert}.x.007")
    names += ["model.embed_tokens.weight", "lm_head.weight", "a", ".b.c", "x.1", "1.2.3"]
    return list(dict.fromkeys(names))


def test_the_sampler_answers_as_the_reference_on_random_names():
    import random

    from mx_strategies.select.name_sampling import parse, _parse_all

    rng = random.Random(36)
    for _ in range(300):
        names = _random_names(rng)
        assert _parse_all(names) == {n: reference_parse(n) for n in names}
        assert all(parse(n) == reference_parse(n) for n in names)
        new, old = Sample(names), ReferenceSample(names)
        first = new.first_round()
        assert first == old.first_round()
        read = [n for n in first if rng.random() < 0.7 or "layers.3." in n]
        second = new.second_round(first, read)
        assert second == old.second_round(first, read)
        fed = first + second
        read += [n for n in second if rng.random() < 0.8]
        assert new.live(fed, read) == old.live(fed, read)
        assert new.infer(fed, read) == old.infer(fed, read)
        stacked = [n for n in fed if rng.random() < 0.5]
        assert new.missing_members(fed, stacked) == old.missing_members(fed, stacked)


def test_only_ascii_digit_components_are_indices():
    """A header's names are any strings: "²" is a digit to str.isdigit() and not to int()."""
    assert parse("model.layers.².mlp.weight") == ("model.layers.².mlp.weight", ())
    assert parse("model.layers.٣.mlp.weight") == ("model.layers.٣.mlp.weight", ())
    assert parse("model.layers.3.mlp.experts.17.w") == ("model.layers.#.mlp.experts.#.w", (3, 17))
    names = ["model.layers.².mlp.gate.weight", "model.layers.1.mlp.².weight", "model.layers.1.mlp.up.weight"]
    assert _parse_all(names) == {
        "model.layers.².mlp.gate.weight": ("model.layers.².mlp.gate.weight", ()),
        "model.layers.1.mlp.².weight": ("model.layers.#.mlp.².weight", (1,)),
        "model.layers.1.mlp.up.weight": ("model.layers.#.mlp.up.weight", (1,)),
    }
