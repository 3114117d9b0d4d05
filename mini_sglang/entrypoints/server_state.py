"""The HTTP server's state, shared by every route: set once by launch_server on
``app.state.server`` and reached by a route through the ``ServerStateDep`` dependency
(or ``server_state(request)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

if TYPE_CHECKING:
    from mini_sglang.managers.tokenizer_manager import TokenizerManager
    from mini_sglang.server_args import ServerArgs


@dataclass
class ServerState:
    """What the routes share. ``status``: "Starting" -> "Up" (after warm-up; /health answers
    503 before) -> "ShuttingDown". ``scheduler_info`` is rank 0's start-up report
    (max_total_num_tokens, max_req_input_len, ...). ``handlers``: request handlers a route
    module builds on first use and keeps here, by class (the OpenAI routes' serving_*)."""

    tokenizer_manager: TokenizerManager
    scheduler_info: dict[str, Any]
    server_args: ServerArgs
    status: str = "Starting"
    handlers: dict[type, Any] = field(default_factory=dict)


def server_state(request: Request) -> ServerState:
    """The state of the server `request` came to (launch_server sets it before serving)."""
    return request.app.state.server


# A route parameter `state: ServerStateDep` receives the server's state.
ServerStateDep = Annotated[ServerState, Depends(server_state)]
