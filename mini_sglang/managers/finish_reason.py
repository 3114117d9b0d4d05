"""Why a request stopped generating (SGLang's ``FINISH_*`` classes).

The scheduler sets one of these on a request when it finishes and ships ``to_json()`` (a plain
dict, so it pickles cheaply and is what the HTTP layer puts in ``meta_info.finish_reason``)
to the detokenizer. The dict shapes are SGLang 0.5.4's wire format, key order included:

    FINISH_LENGTH(16).to_json()         == {"type": "length", "length": 16}
    FINISH_MATCHED_TOKEN(151645)        -> {"type": "stop", "matched": 151645}   # int: EOS / stop id
    FINISH_MATCHED_STR("\\n\\n")        -> {"type": "stop", "matched": "\\n\\n"}  # str: stop string
    FINISH_ABORT("Abort before prefill") -> {"type": "abort", "message": "Abort before prefill",
                                             "status_code": None, "err_type": None}

OpenAI routes map ``type == "stop"`` to ``finish_reason: "stop"`` and ``matched`` to
``matched_stop``; the int/str distinction is how clients tell EOS from a stop string.
"""

from __future__ import annotations

from typing import Any


class BaseFinishReason:
    """Base class: ``is_error`` is True only for aborts; ``to_json()`` gives the wire dict."""

    def __init__(self, is_error: bool = False) -> None:
        self.is_error = is_error

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        # Value equality makes finish reasons easy to compare in tests and after pickling.
        return type(self) is type(other) and self.to_json() == other.to_json()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(sorted(self.to_json().items(), key=str))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_json()!r})"


class FINISH_MATCHED_TOKEN(BaseFinishReason):
    """Stopped on a token id: EOS, an extra EOS id of the model, or one of ``stop_token_ids``."""

    def __init__(self, matched: int | list[int]) -> None:
        super().__init__()
        self.matched = matched

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


class FINISH_MATCHED_STR(BaseFinishReason):
    """Stopped because the output text contains the stop string ``matched``.

    SGLang also uses this for a stop_regex match (``matched`` is then the pattern) and for an
    out-of-vocabulary sampled token (``matched == "NaN happened"``).
    """

    def __init__(self, matched: str) -> None:
        super().__init__()
        self.matched = matched

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


# SGLang spells the regex variant FINISHED_*; it serialises exactly like a matched string.
class FINISHED_MATCHED_REGEX(FINISH_MATCHED_STR):
    """Stopped because the output text matched the stop regex ``matched``."""


class FINISH_LENGTH(BaseFinishReason):
    """Stopped after ``length`` new tokens (max_new_tokens, or the context-length clamp)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def to_json(self) -> dict[str, Any]:
        return {"type": "length", "length": self.length}


class FINISH_ABORT(BaseFinishReason):
    """Aborted (by /abort_request, a client disconnect, or an error found by the scheduler).

    ``message`` defaults to "Aborted" (SGLang); ``status_code`` (an HTTP status) and
    ``err_type`` let the HTTP layer turn an abort into a proper error response.
    """

    def __init__(
        self,
        message: str | None = None,
        status_code: int | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(is_error=True)
        self.message = message or "Aborted"
        self.status_code = status_code
        self.err_type = err_type

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": self.err_type,
        }
