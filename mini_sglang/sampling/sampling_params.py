"""Sampling parameters of one request (SGLang 0.5.4's ``SamplingParams``).

Life of a ``sampling_params`` dict from a /generate body:

    params = SamplingParams.from_dict(body["sampling_params"])  # unknown keys, types
    params.normalize(tokenizer)                                  # stop -> list, stop_str_max_len
    params.verify(vocab_size)                                    # ranges, SGLang's messages

Every failure is a ``ValueError`` whose message names the parameter, which the HTTP layer
turns into a 400. The constructor itself applies SGLang's two rewrites:

    SamplingParams(temperature=0)  -> temperature == 1.0, top_k == 1   (greedy)
    SamplingParams(top_k=-1)       -> top_k == TOP_K_ALL == 1 << 30     (whole vocabulary)
"""

from __future__ import annotations

import logging
import re
from typing import Any

try:  # Python 3.11+ keeps the regex parser here; sre_parse is a deprecated alias.
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from mini_sglang.utils.unicode_check import ensure_valid_unicode

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-6
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
        """Raise ValueError (SGLang's wording) if any value is out of its allowed range."""
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 <= self.repetition_penalty <= 2.0:
            raise ValueError(
                f"repetition_penalty must be in [0, 2], got {self.repetition_penalty}."
            )
        if self.min_new_tokens < 0:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}."
            )
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        # Not checked by SGLang 0.5.4 (n=0 would silently produce an empty batch there).
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}.")
        if self.logit_bias is not None:
            for token_id in self.logit_bias:
                try:
                    ok = 0 <= int(token_id) < vocab_size
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    raise ValueError(
                        f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}."
                    )
        if self.sampling_seed is None:
            raise ValueError("sampling_seed should not be None")
        grammars = [self.json_schema, self.regex, self.ebnf]
        if sum(g is not None for g in grammars) > 1:
            raise ValueError("Only one of regex, json_schema, or ebnf can be set.")

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


def _check_type(key: str, value: Any) -> Any:
    """Check one JSON value's type for ``key``; return it (integral floats become ints)."""
    if value is None:
        if key in _NULLABLE_KEYS:
            return None
        raise ValueError(f"{key} must not be null.")
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in _INT_KEYS:
        if is_number and float(value).is_integer():
            return int(value)
        raise ValueError(f"{key} must be an integer, got {value!r}.")
    if key in _FLOAT_KEYS:
        if is_number:
            return float(value)
        raise ValueError(f"{key} must be a number, got {value!r}.")
    if key in _BOOL_KEYS:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be a boolean, got {value!r}.")
    if key in ("stop", "stop_regex"):
        if isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(s, str) for s in value)
        ):
            return value
        raise ValueError(f"{key} must be a string or a list of strings, got {value!r}.")
    if key == "stop_token_ids":
        if isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value
        ):
            return value
        raise ValueError(f"stop_token_ids must be a list of integers, got {value!r}.")
    if key == "logit_bias":
        if isinstance(value, dict) and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in value.values()
        ):
            return {str(k): float(b) for k, b in value.items()}
        raise ValueError(f"logit_bias must map token ids to numbers, got {value!r}.")
    if key in _STRUCTURED_KEYS:
        if isinstance(value, str):
            return value
        raise ValueError(
            f"{key} must be a string (a JSON schema is passed serialised), got {value!r}."
        )
    if key == "custom_params":
        if isinstance(value, dict):
            return value
        raise ValueError(f"custom_params must be a JSON object, got {value!r}.")
    return value


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
