"""Checking a JSON object against a dataclass's annotations the way SGLang's FastAPI /
pydantic checks a request body. Used by the HTTP layer for every body and by the session
controller for ``session_params``, which the scheduler receives unchecked from the Engine."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError


class BodyValidationError(ValueError):
    """A JSON body whose fields do not fit the request type's annotations: what SGLang's
    FastAPI / pydantic answers with 400 {"object": "error", "type": "Bad Request", ...}."""


def validate_dataclass(cls: type, body: dict[str, Any], where: str = "body") -> Any:
    """`cls(**body)` with every field checked against its annotation the way SGLang's
    FastAPI / pydantic checks a request body (lax: "3" is an int, but 3 is no str).
    Raises BodyValidationError naming each bad field ("<where>.<field>: <why>"; `where`
    places a nested object, e.g. "body.session_params")."""
    try:
        return _adapter(cls).validate_python(body)
    except ValidationError as e:
        raise BodyValidationError(
            "; ".join(
                f"{'.'.join(str(p) for p in (where, *err['loc']))}: {err['msg']}"
                for err in e.errors()
            )
        ) from None


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)
