"""Reject text that is not valid Unicode before a tokenizer sees it.

JSON may escape a lone UTF-16 surrogate ("\\ud800"); Python's json (what FastAPI parses the
OpenAI routes with) turns it into a str that cannot be encoded as UTF-8, and the HF fast
tokenizer then raises an opaque TypeError ("TextEncodeInput must be Union[...]"), which
used to surface as a 500 on /tokenize and as a meaningless 400 elsewhere.
"""

from __future__ import annotations


def ensure_valid_unicode(text: str, what: str) -> None:
    """Raise ValueError naming `what` and the position if `text` holds a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid Unicode: it contains a lone surrogate "
            f"({text[e.start]!r}) at position {e.start}."
        ) from None
