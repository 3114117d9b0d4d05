"""Parsing JSON that is still being generated, and serialising the part of it that is final.

`parse_partial(text)` reads the JSON value at the start of `text` even when the text stops
mid-value. Incomplete containers come back as `OpenDict` / `OpenList` and an unterminated
string as `PartialStr` (subclasses of dict / list / str, so ordinary code can use them);
values that cannot be known yet (a number that may still grow, `tru`, an unfinished key)
are left out. Text that can never become JSON raises `MalformedJSON`.

`stable_prefix(value)` is `json.dumps(value, ensure_ascii=False)` without the closers of
the open containers and strings: a prefix of the final serialisation, which is what lets a
stream send tool-call arguments before the JSON is complete.

Hand-written rather than SGLang's `partial_json_parser` dependency: that library returns
ordinary closed values (an open string comes back as a finished one), so a stream cannot
tell which serialised text is final; SGLang works around it by diffing consecutive parses.
Marking what is still open makes the final prefix exact, in one small module.
"""

from __future__ import annotations

import json
import re
from typing import Any


class MalformedJSON(ValueError):
    """The text is not a prefix of any JSON value."""


class OpenDict(dict):
    """An object whose closing brace has not arrived."""


class OpenList(list):
    """An array whose closing bracket has not arrived."""


class PartialStr(str):
    """A string whose closing quote has not arrived."""


_MISSING: Any = object()  # an incomplete value that is left out of its container
_WS = " \t\n\r"
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_LITERALS = (("true", True), ("false", False), ("null", None))


def parse_partial(text: str, start: int = 0) -> tuple[Any, int, bool]:
    """The JSON value at text[start:] (after whitespace): (value, end, complete).

    `end` is the index just past the value when `complete`, else len(text). The value is
    `None` with complete=False when nothing of it is known yet."""
    value, end, complete = _Parser(text).value(start)
    return (None if value is _MISSING else value), end, complete


def stable_prefix(value: Any) -> str:
    """The final serialisation's prefix that `value` (from parse_partial) already fixes."""
    if isinstance(value, dict):
        items = [f"{_dumps(k)}: {stable_prefix(v)}" for k, v in value.items()]
        return "{" + ", ".join(items) + ("" if isinstance(value, OpenDict) else "}")
    if isinstance(value, list):
        body = ", ".join(stable_prefix(v) for v in value)
        return "[" + body + ("" if isinstance(value, OpenList) else "]")
    text = _dumps(value)
    return text[:-1] if isinstance(value, PartialStr) else text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)

    def _skip_ws(self, i: int) -> int:
        while i < self.n and self.s[i] in _WS:
            i += 1
        return i

    def _error(self, i: int) -> MalformedJSON:
        return MalformedJSON(f"unexpected {self.s[i : i + 10]!r} at offset {i}")

    def value(self, i: int) -> tuple[Any, int, bool]:
        i = self._skip_ws(i)
        if i >= self.n:
            return _MISSING, self.n, False
        c = self.s[i]
        if c == "{":
            return self.container(i + 1, "}")
        if c == "[":
            return self.container(i + 1, "]")
        if c == '"':
            return self.string(i + 1)
        if c == "-" or c.isdigit():
            return self.number(i)
        for literal, val in _LITERALS:
            if self.s.startswith(literal, i):
                return val, i + len(literal), True
            if literal.startswith(self.s[i:]):
                return _MISSING, self.n, False
        raise self._error(i)

    def number(self, i: int) -> tuple[Any, int, bool]:
        end = _NUMBER_CHARS.match(self.s, i).end()  # type: ignore[union-attr]
        if end == self.n:  # more digits may follow
            return _MISSING, self.n, False
        try:
            return json.loads(self.s[i:end]), end, True
        except ValueError:
            raise self._error(i) from None

    def string(self, i: int) -> tuple[Any, int, bool]:
        """A string whose opening quote is at i - 1."""
        j = i
        while j < self.n:
            c = self.s[j]
            if c == '"':
                try:
                    return json.loads(self.s[i - 1 : j + 1]), j + 1, True
                except ValueError:
                    raise self._error(i - 1) from None
            if c == "\\":
                width = 6 if self.s.startswith("u", j + 1) else 2
                if j + width > self.n:  # an escape cut off: decode what precedes it
                    break
                j += width
            else:
                j += 1
        try:
            text = json.loads(self.s[i - 1 : min(j, self.n)] + '"')
        except ValueError:
            raise self._error(i - 1) from None
        if text and "\ud800" <= text[-1] <= "\udbff":  # half a surrogate pair
            text = text[:-1]
        return PartialStr(text), self.n, False

    def _object_key(self, i: int) -> tuple[str | None, int]:
        """An object's key whose opening quote is at i, and the index after its ':'; (None,
        n) when the text ends before the ':'."""
        if self.s[i] != '"':
            raise self._error(i)
        key, i, done = self.string(i + 1)
        i = self._skip_ws(i)
        if not done or i >= self.n:
            return None, self.n
        if self.s[i] != ":":
            raise self._error(i)
        return key, i + 1

    def container(self, i: int, close: str) -> tuple[Any, int, bool]:
        """An object (close '}') or array (close ']') whose opener is at i - 1."""
        is_obj = close == "}"
        items: Any = {} if is_obj else []
        opened = OpenDict if is_obj else OpenList
        i = self._skip_ws(i)
        if i < self.n and self.s[i] == close:
            return items, i + 1, True
        while True:
            i = self._skip_ws(i)
            if i >= self.n:
                return opened(items), self.n, False
            key = None
            if is_obj:
                key, i = self._object_key(i)
                if key is None:
                    return opened(items), self.n, False
            val, i, done = self.value(i)
            if val is not _MISSING:
                if is_obj:
                    items[key] = val
                else:
                    items.append(val)
            i = self._skip_ws(i)
            if not done or i >= self.n:
                return opened(items), self.n, False
            if self.s[i] == close:
                return items, i + 1, True
            if self.s[i] != ",":
                raise self._error(i)
            i += 1
