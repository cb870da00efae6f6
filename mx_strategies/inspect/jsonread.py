"""One guarded JSON reader for everything a probe parses: shard headers, the index, config.json.

A checkpoint is input from whoever wrote it. Python's ``json`` module turns
hostile input into exceptions nobody names (``RecursionError`` for deep
nesting, ``ValueError`` for a 5,000-digit integer) or into values that
break later arithmetic (``Infinity``, ``1e400``), and it keeps the last of
two equal keys without a word. :func:`read_json` refuses all of these
before or while parsing, with one error type, :class:`JsonRejected`,
whose ``reason`` says which rule was broken:

- ``too_large``: more bytes than the cap for this kind of file (the caller
  checks the size before reading; the reader checks again);
- ``not_utf8`` / ``invalid_json`` / ``not_an_object``;
- ``too_deep``: arrays and objects nested deeper than :data:`_MAX_NESTING` (checked on the raw
  text, before the parser recurses);
- ``bad_number``: an integer of more than 24 digits, a
  float that is not finite, ``NaN`` or ``Infinity``;
- ``duplicate_key``: one key twice in an object (``key`` names it);
- ``bad_key``: a key that is no valid Unicode (a lone surrogate escape),
  which serde-based readers such as safetensors refuse.

Parsing is linear in the input; nothing here allocates more than a small
multiple of the (capped) input.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from ..errors import MxStrategiesError

# How deep arrays and objects may nest: real headers, indexes and configs nest 3 to 6 levels; 64 leaves room and
# stays far from the recursion limit.
_MAX_NESTING = 64
# 2**64 has 20 digits; anything longer is no shape, offset or layer count.
_MAX_INT_DIGITS = 24
# Float literals longer than this are not config values (Python parses any length, slowly).
_MAX_FLOAT_CHARS = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN_TO_SQUARE = bytes.maketrans(b"{}", b"[]")


class JsonRejected(MxStrategiesError):
    """A JSON file broke one of the reader's rules; ``reason`` names the rule (see the module doc)."""

    def __init__(self, message: str, reason: str, key: Optional[str] = None) -> None:
        super().__init__(message, mutated=False)
        self.reason = reason
        self.key = key


def _nests_deeper(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` nests arrays/objects deeper than ``limit`` (strings ignored).

    Linear and in C: strings are cut out, everything but brackets deleted,
    then innermost ``[]`` pairs removed one level per pass, at most
    ``limit + 1`` passes. What is left of unbalanced input (``]]][[[``)
    counts its unclosed openers as levels, so ``[[[[...`` without an end is
    refused here too rather than handed to a recursive parser.
    """
    brackets = _STRING.sub(b"", raw).translate(_OPEN_TO_SQUARE, _NOT_BRACKET)
    passes = 0
    while brackets:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
        passes += 1
        if passes > limit:
            return True
    return passes + brackets.count(b"[") > limit


def _parse_int(text: str) -> int:
    digits = len(text) - (text[0] == "-")
    if digits > _MAX_INT_DIGITS:
        raise JsonRejected(f"an integer of {digits} digits (at most {_MAX_INT_DIGITS} allowed)", "bad_number")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > _MAX_FLOAT_CHARS:
        raise JsonRejected(f"a number written with {len(text)} characters (at most {_MAX_FLOAT_CHARS})", "bad_number")
    value = float(text)
    if not math.isfinite(value):
        raise JsonRejected(f"the number {text[:32]} is not finite", "bad_number")
    return value


def _parse_constant(text: str) -> Any:
    raise JsonRejected(f"{text} is not a JSON number", "bad_number")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonRejected(f"key {key!r} appears twice in one object", "duplicate_key", key)
            seen.add(key)
    for key in result:
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise JsonRejected(f"key {key!r} is not valid Unicode (a lone surrogate escape)", "bad_key") from None
    return result


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_object,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_parse_constant,
)


def read_json(raw: bytes, *, max_bytes: int, cap_name: str = "the cap", want_object: bool = True) -> Any:
    """Parse ``raw`` under the rules above; raise :class:`JsonRejected` for any breach.

    ``cap_name`` says what holds ``max_bytes`` (a setting, or the fixed limit), for the message.
    ``want_object``: the top level must be an object (every file we read is one).
    """
    if len(raw) > max_bytes:
        raise JsonRejected(f"{len(raw)} bytes, over {cap_name} of {max_bytes}", "too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRejected(f"not UTF-8 text ({exc.reason} at byte {exc.start})", "not_utf8") from None
    if _nests_deeper(raw, _MAX_NESTING):
        raise JsonRejected(f"nested deeper than {_MAX_NESTING} levels", "too_deep")
    try:
        value = _DECODER.decode(text)  # JSON whitespace around the value, nothing else
    except JsonRejected:
        raise
    except json.JSONDecodeError as exc:
        raise JsonRejected(f"not valid JSON ({exc})", "invalid_json") from None
    except RecursionError:  # a backstop: the depth check above comes first
        raise JsonRejected(f"nested deeper than {_MAX_NESTING} levels", "too_deep") from None
    except (ValueError, OverflowError, TypeError) as exc:  # a hook or the parser on input we did not foresee
        raise JsonRejected(f"not valid JSON ({type(exc).__name__}: {exc})", "invalid_json") from None
    if want_object and not isinstance(value, dict):
        raise JsonRejected(f"not a JSON object (a {_json_type(value)})", "not_an_object")
    return value


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )

