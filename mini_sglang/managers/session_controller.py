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
        """(the request's input ids, its parent node or None, an error message or None).

        Applies `replace` to the tree as a side effect (only when there is no error)."""
        p = recv.session_params or {}
        parent, error = self._parent(p.get("rid"), bool(p.get("replace")))
        if error is not None:
            return recv.input_ids, None, error
        if p.get("replace"):
            self._replace(parent)
        if parent is None:
            return recv.input_ids, None, None
        new = recv.input_ids
        if new and bos is not None and new[0] == bos:  # an append, not a new document
            new = new[1:]
        return self._context(parent.req, p) + new, parent, None

    def _parent(self, rid: Optional[str], replace: bool):
        """(the node of `rid` or None, an error message or None)."""
        if rid is None:
            return None, None
        parent = self.nodes.get(rid)
        if parent is None:
            return None, f"Request {rid} is not in session {self.session_id}."
        if not replace and not parent.req.finished():
            return None, f"Request {rid} has not finished yet."
        return parent, None

    def _replace(self, parent: Optional[SessionNode]) -> None:
        """Drop what the new request replaces: without a parent the whole tree, else the
        parent's continuations (and the parent itself, if still running, is aborted)."""
        if parent is None:
            for node in self.nodes.values():
                if not node.req.finished():
                    node.req.abort("Replaced in its session")
            self.nodes.clear()
            return
        if not parent.req.finished():
            parent.req.abort("Replaced in its session")
        for child in parent.children:
            child.drop(self.nodes)
        parent.children = []

    @staticmethod
    def _context(last: Any, p: dict) -> list[int]:
        """The tokens a continuation of `last` starts from.

        Worked example: last has prompt [1, 5, 6] and output [7, 8, 9] -> [1, 5, 6, 7, 8, 9];
        with drop_previous_output [1, 5, 6]; with offset 4 [1, 5, 6, 7]. Output beyond
        max_new_tokens (a surplus token of overlap scheduling) is never part of it."""
        context = list(last.origin_input_ids)
        if not p.get("drop_previous_output"):
            context += last.output_ids[: last.sampling_params.max_new_tokens]
        if p.get("offset"):
            context = context[: p["offset"]]
        return context

    def add(self, req: Any, parent: Optional[SessionNode]) -> None:
        node = SessionNode(req)
        if parent is not None:
            parent.children.append(node)
        self.nodes[req.rid] = node


# Where a new request goes in its session: (session, parent node or None).
SessionLink = tuple[Session, Optional[SessionNode]]


class SessionController:
    """The scheduler's open sessions. The scheduler routes Open/CloseSessionReqInput here
    (see `dispatch`), asks `lookup` for a generate request's input ids before it builds the
    Req, and, once the Req is queued, `record`s it in its session."""

    def __init__(self, model_config: Any) -> None:
        self.model_config = model_config  # its hf_config's bos_token_id, read per request
        self.sessions: dict[str, Session] = {}

    def __getitem__(self, session_id: str) -> Session:
        return self.sessions[session_id]

    def dispatch(self) -> dict[type, Any]:
        """Entries for the scheduler's type -> handler table."""
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

    def lookup(
        self, recv: TokenizedGenerateReqInput
    ) -> tuple[list[int], Optional[SessionLink], Optional[str]]:
        """(input ids, where to record the request or None, a 400 error message or None)."""
        sid = (recv.session_params or {}).get("id")
        if sid is None:
            return recv.input_ids, None, None
        session = self.sessions.get(sid)
        if session is None:
            return recv.input_ids, None, f"Invalid request: session id {sid} does not exist"
        bos = getattr(self.model_config.hf_config, "bos_token_id", None)
        ids, parent, error = session.input_ids(recv, bos)
        return ids, (session, parent), error

    @staticmethod
    def record(req: Any, link: Optional[SessionLink]) -> None:
        """Add a queued request to the session `lookup` named (nothing without one)."""
        if link is not None:
            session, parent = link
            session.add(req, parent)
