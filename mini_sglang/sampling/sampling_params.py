"""Sampling parameters of one request (SGLang 0.5.4's ``SamplingParams``).

Life of a ``sampling_params`` dict from a /generate body:

    params = SamplingParams.from_dict(body["sampling_params"])  # unknown keys, types
    params.normalize(tokenizer)                                  # stop -> list, stop_str_max_len
    params.verify(vocab_size)                                    # ranges, SGLang's messages

Every failure is a ``ValueError`` whose message names the parameter, which the HTTP layer
turns into a 400. Values are checked against what the scheduler's tensors can hold (integers
in int64, floats finite and within float32's range), so no accepted request can fail there. The constructor itself applies SGLang's two rewrites:

    SamplingParams(temperature=0)  -> temperature == 1.0, top_k == 1   (greedy)
    SamplingParams(top_k=-1)       -> top_k == TOP_K_ALL == 1 << 30     (whole vocabulary)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

try:  # Python 3.11+ keeps the regex parser here; sre_parse is a deprecated alias.
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from mini_sglang.utils.unicode_check import ensure_valid_unicode

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-6
# What the batch's sampling tensors hold: int64 seeds and counts, float32 parameters/biases.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
FLOAT32_MAX = 3.4028234663852886e38
TOP_K_ALL = 1 << 30
# Upper bound used when a stop regex can match unboundedly many characters.
MAX_LEN = 1 << 30

_STRUCTURED_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
_INT_KEYS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval", "sampling_seed")
_FLOAT_KEYS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
# Keys that may be null in JSON (None keeps the default meaning, e.g. unbounded max_new_tokens).
_NULLABLE_KEYS = frozenset(
    {"max_new_tokens", "stream_interval", "stop", "stop_token_ids", "stop_regex"}
    | set(_STRUCTURED_KEYS)
    | {"custom_params", "logit_bias"}
)


class SamplingParams:
    """How to sample one request's tokens; field names and defaults are SGLang 0.5.4's.

    Contract: the constructor never raises (it only rewrites greedy and ``top_k=-1``);
    ``from_dict`` rejects unknown keys, structural_tag and wrongly typed values;
    ``verify(vocab_size)`` rejects out-of-range values; ``normalize(tokenizer)`` must run
    before the scheduler reads ``stop_strs`` / ``stop_str_max_len``. ``stop`` is stored as
    ``stop_strs`` and ``stop_regex`` as ``stop_regex_strs`` (SGLang's attribute names);
    ``stop_token_ids`` becomes a set (or None).
    """

    def __init__(
        self,
        max_new_tokens: int | None = 128,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        min_new_tokens: int = 0,
        n: int = 1,
        json_schema: str | None = None,
        regex: str | None = None,
        ebnf: str | None = None,
        structural_tag: str | None = None,
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        no_stop_trim: bool = False,
        custom_params: dict[str, Any] | None = None,
        stream_interval: int | None = None,
        logit_bias: dict[str, float] | None = None,
        sampling_seed: int = 42,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.stop_strs: str | list[str] | None = stop
        self.stop_token_ids: set[int] | None = set(stop_token_ids) if stop_token_ids else None
        self.stop_regex_strs: str | list[str] | None = stop_regex
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        self.repetition_penalty = repetition_penalty
        self.min_new_tokens = min_new_tokens
        self.n = n
        self.json_schema = json_schema
        self.regex = regex
        self.ebnf = ebnf
        self.structural_tag = structural_tag
        self.ignore_eos = ignore_eos
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.no_stop_trim = no_stop_trim
        self.custom_params = custom_params
        self.stream_interval = stream_interval
        self.logit_bias = logit_bias
        self.sampling_seed = sampling_seed
        # Filled by normalize(); 0 until then so the scheduler's tail window is well defined.
        self.stop_str_max_len = 0
        self.stop_regex_max_len = 0

        # A (near-)zero temperature means greedy. SGLang expresses greedy as top_k=1 with a
        # neutral temperature so the sampler never divides by ~0.
        if 0 <= self.temperature < _SAMPLING_EPS:
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL

    # ------------------------------------------------------------------ construction
    @classmethod
    def valid_keys(cls) -> tuple[str, ...]:
        """The keys ``from_dict`` accepts: the constructor's parameter names."""
        code = cls.__init__.__code__
        return code.co_varnames[1 : code.co_argcount]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a request's ``sampling_params`` JSON object, rejecting bad input.

        Raises ValueError for: a non-object; unknown keys (all named, valid keys listed);
        structural_tag (not implemented); a value of the wrong JSON type (naming the key;
        json_schema / regex / ebnf must be strings). Range checks and "at most one
        constraint" are left to ``verify``; whether a constraint compiles is the
        scheduler's grammar backend's call.
        """
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a JSON object, got {type(d).__name__}.")
        valid = cls.valid_keys()
        unknown = sorted(k for k in d if k not in valid)
        if unknown:
            raise ValueError(
                f"Unknown sampling parameter(s): {', '.join(map(repr, unknown))}. "
                f"Valid sampling parameters are: {', '.join(valid)}."
            )
        if d.get("structural_tag") is not None:
            raise ValueError(
                "Structured output (structural_tag) is not supported by mini-sglang yet; "
                "json_schema, regex and ebnf are."
            )
        kwargs = {k: _check_type(k, v) for k, v in d.items()}
        return cls(**kwargs)

    # ------------------------------------------------------------------ validation
    def verify(self, vocab_size: int) -> None:
        """Raise ValueError (SGLang's wording) if any value is out of its allowed range.

        Beyond SGLang: every float must be finite and within float32's range (NaN passes
        SGLang's own comparisons), sampling_seed must fit int64, and n must be at least 1."""
        for name in _FLOAT_KEYS:
            _check_float32(name, getattr(self, name))
        for ok, message in self._range_rules():
            if not ok:
                raise ValueError(message)
        self._verify_lengths()
        self._verify_logit_bias(vocab_size)
        if self.sampling_seed is None:
            raise ValueError("sampling_seed should not be None")
        _check_int64("sampling_seed", self.sampling_seed)
        grammars = [self.json_schema, self.regex, self.ebnf]
        if sum(g is not None for g in grammars) > 1:
            raise ValueError("Only one of regex, json_schema, or ebnf can be set.")

    def _range_rules(self) -> list[tuple[bool, str]]:
        """(value is in range, SGLang's message otherwise) for the scalar parameters."""
        fp, pp, rp = self.frequency_penalty, self.presence_penalty, self.repetition_penalty
        return [
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}."),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}."),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}."),
            (self.top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {self.top_k}."),
            (-2.0 <= fp <= 2.0, f"frequency_penalty must be in [-2, 2], got {fp}."),
            (-2.0 <= pp <= 2.0, f"presence_penalty must be in [-2, 2], got {pp}."),
            (0.0 <= rp <= 2.0, f"repetition_penalty must be in [0, 2], got {rp}."),
            # Not checked by SGLang 0.5.4 (n=0 would silently produce an empty batch there).
            (self.n >= 1, f"n must be at least 1, got {self.n}."),
            (
                self.stream_interval is None or self.stream_interval >= 1,
                f"stream_interval must be at least 1, got {self.stream_interval}.",
            ),
        ]

    def _verify_lengths(self) -> None:
        if self.min_new_tokens < 0:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}."
            )
        if self.max_new_tokens is None:
            return
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                f"got {self.min_new_tokens}."
            )

    def _verify_logit_bias(self, vocab_size: int) -> None:
        for token_id, bias in (self.logit_bias or {}).items():
            try:
                ok = 0 <= int(token_id) < vocab_size
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(
                    f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}."
                )
            _check_bias(token_id, bias)

    def normalize(self, tokenizer: Any | None) -> None:
        """Turn ``stop``/``stop_regex`` into lists and compute their look-back windows.

        ``stop_str_max_len`` is the longest stop string in tokens (in characters when there is
        no tokenizer); the scheduler decodes that many trailing tokens (+2) to look for a stop
        string, so it must cover a stop string that spans token boundaries.
        ``stop_regex_max_len`` is an upper bound on a regex match's length in characters.
        """
        if self.stop_strs is None:
            self.stop_strs = []
            self.stop_str_max_len = 0
        else:
            if isinstance(self.stop_strs, str):
                self.stop_strs = [self.stop_strs]
            max_len = 0
            for stop_str in self.stop_strs:
                ensure_valid_unicode(stop_str, "stop")
                if tokenizer is not None:
                    n = len(tokenizer.encode(stop_str, add_special_tokens=False))
                else:
                    n = len(stop_str)
                max_len = max(max_len, n)
            self.stop_str_max_len = max_len

        if self.stop_regex_strs is None:
            self.stop_regex_strs = []
            self.stop_regex_max_len = 0
        else:
            if isinstance(self.stop_regex_strs, str):
                self.stop_regex_strs = [self.stop_regex_strs]
            try:
                self.stop_regex_max_len = max(
                    (get_max_seq_length(r) for r in self.stop_regex_strs), default=0
                )
            except re.error as e:  # a client error (400), not a server crash
                raise ValueError(f"stop_regex is not a valid regular expression: {e}") from e

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"SamplingParams({fields})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SamplingParams) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable like a dataclass


def _is_float32(value: Any) -> bool:
    """A finite number that float32 holds without overflowing (NaN, +-inf, 1e39 are not)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _check_float32(key: str, value: float) -> None:
    if not _is_float32(value):
        raise ValueError(
            f"{key} must be a finite number in [{-FLOAT32_MAX}, {FLOAT32_MAX}], got {value}."
        )


def _check_int64(key: str, value: int | float) -> None:
    if not INT64_MIN <= value <= INT64_MAX:  # exact for floats too (3.4e38 is an integer)
        raise ValueError(f"{key} must be in [{INT64_MIN}, {INT64_MAX}], got {value}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_int(key: str, value: Any) -> int:
    """A JSON integer (16.0 counts) that fits int64."""
    integral_float = isinstance(value, float) and math.isfinite(value) and value.is_integer()
    if not integral_float and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} must be an integer, got {value!r}.")
    _check_int64(key, value)  # the message shows the value as the client sent it
    return int(value)


def _to_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        return math.inf if value > 0 else -math.inf


def _as_float(key: str, value: Any) -> float:
    """A finite JSON number within float32's range, as a float."""
    if not _is_number(value):
        raise ValueError(f"{key} must be a number, got {value!r}.")
    result = _to_float(value)
    _check_float32(key, result)
    return result


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{key} must be a boolean, got {value!r}.")


def _as_strings(key: str, value: Any) -> str | list[str]:
    if isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(s, str) for s in value)
    ):
        return value
    raise ValueError(f"{key} must be a string or a list of strings, got {value!r}.")


def _as_token_ids(key: str, value: Any) -> list[int]:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        return value
    raise ValueError(f"stop_token_ids must be a list of integers, got {value!r}.")


def _check_bias(token_id: Any, bias: float) -> None:
    if not _is_float32(bias):
        raise ValueError(
            f"logit_bias values must be finite numbers in [{-FLOAT32_MAX}, {FLOAT32_MAX}], "
            f"got {bias} for token {token_id}."
        )


def _as_logit_bias(key: str, value: Any) -> dict[str, float]:
    """Token id (a string, checked against the vocabulary by verify) -> a float32 bias."""
    if not isinstance(value, dict) or not all(_is_number(b) for b in value.values()):
        raise ValueError(f"logit_bias must map token ids to numbers, got {value!r}.")
    for token_id, bias in value.items():
        _check_bias(token_id, _to_float(bias))
    return {str(k): float(b) for k, b in value.items()}


def _as_structured(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"{key} must be a string (a JSON schema is passed serialised), got {value!r}.")


def _as_object(key: str, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    raise ValueError(f"{key} must be a JSON object, got {value!r}.")


# key -> checker(key, value) returning the value to store (ValueError naming the key).
_CHECKERS: dict[str, Callable[[str, Any], Any]] = {
    **dict.fromkeys(_INT_KEYS, _as_int),
    **dict.fromkeys(_FLOAT_KEYS, _as_float),
    **dict.fromkeys(_BOOL_KEYS, _as_bool),
    **dict.fromkeys(("stop", "stop_regex"), _as_strings),
    "stop_token_ids": _as_token_ids,
    "logit_bias": _as_logit_bias,
    **dict.fromkeys(_STRUCTURED_KEYS, _as_structured),
    "custom_params": _as_object,
}


def _check_type(key: str, value: Any) -> Any:
    """Check one JSON value's type for ``key``; return it (integral floats become ints).

    Integers must fit int64 and floats must be finite within float32's range: the
    scheduler builds the batch's tensors from them, and a value they cannot hold would fail
    there, for the whole batch."""
    if value is None:
        if key in _NULLABLE_KEYS:
            return None
        raise ValueError(f"{key} must not be null.")
    checker = _CHECKERS.get(key)
    return value if checker is None else checker(key, value)


def get_max_seq_length(regex_str: str) -> int:
    """Upper bound on the length (characters) of any match of ``regex_str``.

    Unbounded repeats and constructs we do not model give ``MAX_LEN``. Example:
    ``get_max_seq_length("ab|c{2,3}") == 3``; ``get_max_seq_length("a+") >= MAX_LEN``.
    """
    return _max_len(_sre_parse.parse(regex_str))


def _max_len(subpattern: Any) -> int:
    total = 0
    for op, value in subpattern:
        if op in (_sre_parse.LITERAL, _sre_parse.NOT_LITERAL, _sre_parse.IN, _sre_parse.ANY):
            total += 1
        elif op == _sre_parse.SUBPATTERN:
            total += _max_len(value[-1])
        elif op == _sre_parse.BRANCH:
            total += max(_max_len(branch) for branch in value[1])
        elif op in (_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT):
            _, max_repeat, inner = value
            if max_repeat == _sre_parse.MAXREPEAT:
                total += MAX_LEN
            else:
                total += max_repeat * _max_len(inner)
        elif op == _sre_parse.AT:
            pass  # zero-width assertions (^, $, \b)
        else:
            logger.warning("Unhandled regex token %s in stop_regex; assuming unbounded.", op)
            total += MAX_LEN
    return total
