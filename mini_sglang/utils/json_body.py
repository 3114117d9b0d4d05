"""Response bodies in the bytes FastAPI writes for a route that returns plain data without a
response class, as SGLang 0.5.4's non-stream /generate, chat, completions and /v1/score do:
Starlette's JSONResponse, i.e. json.dumps, compact, UTF-8. Floats read as Python writes them
(-2e-06 and 1e+16, where orjson and pydantic write -0.000002 and 1e16).

One deliberate difference: a non-finite float (the -inf logprob of a token a grammar masks)
is written null, as orjson and pydantic write it; json.dumps refuses it, a 500 in SGLang.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse


def null_non_finite(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, scalars) with inf and nan floats replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [null_non_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: null_non_finite(v) for k, v in value.items()}
    return value


def fastapi_default_response(content: Any) -> JSONResponse:
    """`content` as FastAPI's default response writes it (see the module docstring). The
    copy without non-finite floats is made only when json.dumps refuses them, which is rare,
    so a long logprob list is not walked twice."""
    try:
        return JSONResponse(content)
    except ValueError:  # json.dumps(allow_nan=False): an inf or nan somewhere
        return JSONResponse(null_non_finite(content))
