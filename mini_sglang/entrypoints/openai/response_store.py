"""The Responses API's in-memory store: response objects by id, each with the conversation
that produced it (the chat messages of its prompt followed by its assistant reply), for
GET /v1/responses/{id}, `previous_response_id` and cancel.

Bounded: an LRU of at most `capacity` responses (a put or get refreshes an entry; the least
recently used is dropped when full). It lives in the HTTP process and is lost on restart.
Used only from the server's event loop, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from mini_sglang.entrypoints.openai.protocol_responses import ResponsesResponse

DEFAULT_CAPACITY = 4096


@dataclass
class StoredResponse:
    """A response and the conversation (chat message dicts) ending with its reply."""

    response: ResponsesResponse
    messages: list[dict[str, Any]] = field(default_factory=list)


class ResponseStore:
    """An LRU map id -> StoredResponse of at most `capacity` entries."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def pop(self, response_id: str) -> StoredResponse | None:
        """Remove and return the entry of `response_id` (None if absent)."""
        return self._entries.pop(response_id, None)

    def put(self, entry: StoredResponse) -> None:
        """Insert or replace the entry of `entry.response.id`, dropping the least recently
        used one beyond capacity."""
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
