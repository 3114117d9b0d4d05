"""ResponseStore: an LRU of responses by id, bounded by its capacity."""

from __future__ import annotations

import pytest

from mini_sglang.entrypoints.openai.protocol_responses import ResponsesResponse
from mini_sglang.entrypoints.openai.response_store import ResponseStore, StoredResponse


def _entry(i: int) -> StoredResponse:
    response = ResponsesResponse(id=f"resp_{i}", model="m", status="completed")
    return StoredResponse(response, [{"role": "user", "content": str(i)}])


def test_get_put_and_replace():
    store = ResponseStore(capacity=2)
    assert store.get("resp_0") is None
    store.put(_entry(0))
    assert store.get("resp_0").messages == [{"role": "user", "content": "0"}]
    replaced = _entry(0)
    replaced.response.status = "cancelled"
    store.put(replaced)
    assert len(store) == 1 and store.get("resp_0").response.status == "cancelled"
    assert store.pop("resp_0") is replaced and store.pop("resp_0") is None
    assert len(store) == 0


def test_least_recently_used_is_dropped():
    store = ResponseStore(capacity=2)
    store.put(_entry(0))
    store.put(_entry(1))
    store.get("resp_0")  # 1 is now the least recently used
    store.put(_entry(2))
    assert len(store) == 2
    assert store.get("resp_1") is None
    assert store.get("resp_0") is not None and store.get("resp_2") is not None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        ResponseStore(capacity=0)
