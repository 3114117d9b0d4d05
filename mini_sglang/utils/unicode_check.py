"""Reject text that is not valid Unicode before a tokenizer sees it.

JSON may escape a lone UTF-16 surrogate ("\\ud800"); Python's json turns it into a str that
cannot be encoded as UTF-8, and the HF fast tokenizer then raises an opaque TypeError
("TextEncodeInput must be Union[...]"), which would surface as a 500 on /tokenize and as
a meaningless 400 elsewhere. The HTTP routes refuse such bodies when parsing them
(orjson for the native routes, openai/routes.validate_json_request for the OpenAI ones);
these checks keep the TokenizerManager safe for in-process callers (the Engine API).
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


def json_safe(message: str) -> str:
    """`message` with lone surrogates written as backslash escapes. Error messages may quote
    client input; orjson and pydantic refuse to serialise a lone surrogate, so an error
    envelope quoting one unescaped would turn a 400 into a 500."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")
