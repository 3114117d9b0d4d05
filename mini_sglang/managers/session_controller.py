"""Sessions (SGLang 0.5.4's /open_session, /close_session and generate's session_params).

A session keeps the requests made in it as a tree, so a client can continue a conversation
by naming the request to continue instead of resending its tokens:

    POST /open_session {"capacity_of_str_len": 1000}              -> "<session id>"
    POST /generate {"input_ids": P1, "session_params": {"id": sid}}           (request r1)
    POST /generate {"input_ids": P2, "session_params": {"id": sid, "rid": "r1"}}

The second request's prompt is r1's prompt + r1's output + P2 (a leading BOS of P2 dropped),
so the radix cache serves everything but P2 from r1's KV. session_params fields:
- rid: the request to continue (it must have finished); none starts a new root.
- offset: keep only the first `offset` tokens of that context before appending P2.
- drop_previous_output: continue from rid's prompt without its output.
- replace: rid's other continuations are dropped (aborted if still running) and this
  request takes their place; replace without rid drops the whole tree first.
Naming a session that is not open, or a rid the session does not hold, is a 400; the input
ids built here go through the usual length checks. Limitation: with --dp-size N every
replica opens the session, but a continuation reaches whichever replica the DP controller
picks, which may not hold its parent (then it is that 400).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from mini_sglang.managers.io_struct.control import (
    CloseSessionReqInput,
    OpenSessionReqInput,
    OpenSessionReqOutput,
)
from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
from mini_sglang.utils.dataclass_validation import validate_dataclass

logger = logging.getLogger("mini_sglang")


@dataclass
class SessionParams:
    """generate's session_params (SGLang's SessionParams)."""

    id: Optional[str] = None
    rid: Optional[str] = None
    offset: Optional[int] = None
    replace: Optional[bool] = None
    drop_previous_output: Optional[bool] = None


def normalize_session_params(params: Any) -> dict:
    """session_params validated as a request body is (lax, like SGLang's pydantic: "3" is an
    offset of 3), as a dict of every SessionParams field; raises ValueError."""
    if not isinstance(params, dict):
        raise ValueError('session_params must be an object such as {"id": "<session id>"}.')
    known = {f.name for f in dataclasses.fields(SessionParams)}
    for key in params:
        if key not in known:
            raise ValueError(f"session_params: unknown field {key!r}.")
    return dataclasses.asdict(validate_dataclass(SessionParams, params, "body.session_params"))


@dataclass
class SessionNode:
    req: Any  # managers.req.Req
    children: list[SessionNode] = field(default_factory=list)

    def drop(self, nodes: dict[str, SessionNode]) -> None:
        """Remove this subtree from `nodes`, aborting requests still running in it."""
        for child in self.children:
            child.drop(nodes)
        self.children = []
        if not self.req.finished():
            self.req.abort("Replaced in its session")
        nodes.pop(self.req.rid, None)


@dataclass
class Session:
    session_id: str
    capacity_of_str_len: int
    nodes: dict[str, SessionNode] = field(default_factory=dict)

    def input_ids(self, recv: TokenizedGenerateReqInput, bos: Optional[int]):
        """(the request's input ids, its parent node or None, an error message or None)."""
        p = recv.session_params or {}
        parent_rid, parent = p.get("rid"), None
        if parent_rid is not None:
            parent = self.nodes.get(parent_rid)
            if parent is None:
                return (
                    recv.input_ids,
                    None,
                    f"Request {parent_rid} is not in session {self.session_id}.",
                )
            if not p.get("replace") and not parent.req.finished():
                return recv.input_ids, None, f"Request {parent_rid} has not finished yet."
        if p.get("replace"):
            if parent is None:  # a new tree: drop the whole old one
                for node in self.nodes.values():
                    if not node.req.finished():
                        node.req.abort("Replaced in its session")
                self.nodes.clear()
            else:  # rid's continuations (and rid itself, if running) give way
                if not parent.req.finished():
                    parent.req.abort("Replaced in its session")
                for child in parent.children:
                    child.drop(self.nodes)
                parent.children = []
        if parent is None:
            return recv.input_ids, None, None
        new = recv.input_ids
        if new and bos is not None and new[0] == bos:  # an append, not a new document
            new = new[1:]
        last = parent.req
        context = list(last.origin_input_ids)
        if not p.get("drop_previous_output"):
            context += last.output_ids[: last.sampling_params.max_new_tokens]
        if p.get("offset"):
            context = context[: p["offset"]]
        return context + new, parent, None

    def add(self, req: Any, parent: Optional[SessionNode]) -> None:
        node = SessionNode(req)
        if parent is not None:
            parent.children.append(node)
        self.nodes[req.rid] = node


class SchedulerSessionMixin:
    def init_sessions(self) -> None:
        self.sessions: dict[str, Session] = {}

    def session_dispatch(self) -> dict[type, Any]:
        return {OpenSessionReqInput: self.open_session, CloseSessionReqInput: self.close_session}

    def open_session(self, recv: OpenSessionReqInput) -> OpenSessionReqOutput:
        sid = recv.session_id
        if sid is None or sid in self.sessions:
            logger.warning("session id %s is None or already open, cannot open.", sid)
            return OpenSessionReqOutput(sid, False)
        self.sessions[sid] = Session(sid, recv.capacity_of_str_len)
        return OpenSessionReqOutput(sid, True)

    def close_session(self, recv: CloseSessionReqInput) -> None:
        if self.sessions.pop(recv.session_id, None) is None:
            logger.warning("session id %s does not exist, cannot delete.", recv.session_id)

    def session_input_ids(self, recv: TokenizedGenerateReqInput):
        """(input ids, a callback that records the new Req in its session, error or None)."""
        sid = (recv.session_params or {}).get("id")
        if sid is None:
            return recv.input_ids, lambda req: None, None
        session = self.sessions.get(sid)
        if session is None:
            error = f"Invalid request: session id {sid} does not exist"
            return recv.input_ids, lambda req: None, error
        bos = getattr(self.model_config.hf_config, "bos_token_id", None)
        ids, parent, error = session.input_ids(recv, bos)
        return ids, (lambda req: session.add(req, parent)), error
