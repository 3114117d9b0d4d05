"""--log-requests / --log-requests-level and /configure_logging (SGLang 0.5.4).

With request logging on, the TokenizerManager logs "Receive: obj=GenerateReqInput(...)" for
every /generate call (after normalisation) and "Finish: obj=GenerateReqInput(...), out={...}"
when each of its requests finishes. The level says how much of each object is shown:

- 0: metadata only (no prompt text or ids, no sampling params; no output text or ids)
- 1: level 0 plus the sampling params
- 2: everything, strings and lists longer than 2048 cut to their first and last 1024
- 3: everything, uncut

`truncated_repr` is SGLang's dataclass_to_string_truncated, so the lines read the same.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from mini_sglang.managers.io_struct.control import ConfigureLoggingReq

logger = logging.getLogger("mini_sglang")

_UNCUT = 1 << 30
_INPUTS = frozenset({"text", "input_ids", "input_embeds", "image_data", "audio_data", "lora_path"})
_OUTPUTS = frozenset({"text", "output_ids", "embedding"})
LEVELS = (0, 1, 2, 3)


@dataclass(frozen=True)
class RequestLogFormat:
    max_length: int
    skip_names: frozenset[str] = frozenset()  # top-level fields of the request left out
    out_skip_names: frozenset[str] = frozenset()  # top-level keys of the output left out


def request_log_format(level: int) -> RequestLogFormat:
    if level == 0:
        return RequestLogFormat(_UNCUT, _INPUTS | {"sampling_params"}, _OUTPUTS)
    if level == 1:
        return RequestLogFormat(_UNCUT, _INPUTS, _OUTPUTS)
    if level == 2:
        return RequestLogFormat(2048)
    if level == 3:
        return RequestLogFormat(_UNCUT)
    raise ValueError(f"log_requests_level must be one of {list(LEVELS)}, got {level!r}.")


def truncated_repr(data: Any, max_length: int = 2048, skip_names: frozenset[str] = frozenset()):
    """repr-like text of a dataclass / dict / list / str, each string or list longer than
    max_length shown as its first and last max_length // 2 items around " ... ".
    skip_names applies to the top level only, as in SGLang.
    Example, max_length 4: "abcdefgh" -> "'ab' ... 'gh'"; [1, 2, 3, 4, 5] -> "[1, 2] ... [4, 5]"."""
    half = max_length // 2
    if isinstance(data, str):
        return f"{data[:half]!r} ... {data[-half:]!r}" if len(data) > max_length else repr(data)
    if isinstance(data, (list, tuple)):
        return f"{data[:half]} ... {data[-half:]}" if len(data) > max_length else str(data)
    if isinstance(data, dict):
        shown = (
            f"'{k}': {truncated_repr(v, max_length)}"
            for k, v in data.items()
            if k not in skip_names
        )
        return "{" + ", ".join(shown) + "}"
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        shown = (f for f in dataclasses.fields(data) if f.name not in skip_names)
        body = ", ".join(
            f"{f.name}={truncated_repr(getattr(data, f.name), max_length)}" for f in shown
        )
        return f"{type(data).__name__}({body})"
    return str(data)


class RequestLogger:
    """The TokenizerManager's request logging state (on/off, level), changed at run time by
    /configure_logging."""

    def __init__(self, enabled: bool, level: int) -> None:
        self.enabled = enabled
        self.level = level
        self.format = request_log_format(level)

    def receive(self, obj: Any) -> None:
        if self.enabled:
            fmt = self.format
            logger.info("Receive: obj=%s", truncated_repr(obj, fmt.max_length, fmt.skip_names))

    def finish(self, obj: Any, out: dict) -> None:
        if self.enabled:
            fmt = self.format
            logger.info(
                "Finish: obj=%s, out=%s",
                truncated_repr(obj, fmt.max_length, fmt.skip_names),
                truncated_repr(out, fmt.max_length, fmt.out_skip_names),
            )

    def configure(self, req: ConfigureLoggingReq) -> None:
        """Apply the fields that are not None. A bad level raises ValueError and changes
        nothing; the request-dump options (SGLang's) are not implemented and are ignored with
        a warning."""
        level = self.level if req.log_requests_level is None else req.log_requests_level
        fmt = request_log_format(level)
        for name in ("dump_requests_folder", "dump_requests_threshold", "crash_dump_folder"):
            if getattr(req, name) is not None:
                logger.warning("/configure_logging: %s is not supported by mini-sglang", name)
        if req.log_requests is not None:
            self.enabled = req.log_requests
        self.level, self.format = level, fmt
        logger.info("Config logging: obj=%s", req)
