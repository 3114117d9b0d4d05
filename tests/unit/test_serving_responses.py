"""OpenAIServingResponses without a server: the real chat rendering (Qwen3's template and
reasoning parser) over a scripted TokenizerManager stand-in, for what the default-model
server test cannot reach: reasoning items (non-stream and their stream events),
previous_response_id leaving reasoning out, and cancelling an in-flight stream."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from mini_sglang.entrypoints.openai.protocol_responses import ResponsesRequest
from mini_sglang.entrypoints.openai.response_store import ResponseStore
from mini_sglang.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_sglang.entrypoints.openai.serving_responses import OpenAIServingResponses

# The cumulative text of each stream output; the last one finishes.
SCRIPT = ["<think>", "<think>I think", "<think>I think</think>", "<think>I think</think>\n\nBlue."]


class ScriptedTokenizerManager:
    """Yields SCRIPT's outputs (all of them when streaming, else the last); with `hold`
    the generation waits after the first output until abort_request ends it."""

    def __init__(self, tokenizer: Any, hold: bool = False) -> None:
        self.tokenizer = tokenizer
        self.server_args = SimpleNamespace(
            reasoning_parser="qwen3", tool_call_parser=None, enable_cache_report=False
        )
        self.model_config = SimpleNamespace(generation_defaults={})
        self.prompts: list[list[int]] = []
        self.aborted: list[str] = []
        self.hold = hold
        self._released = asyncio.Event()

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)
        self._released.set()

    async def generate_request(self, obj: Any, request: Any = None):
        self.prompts.append(list(obj.input_ids))

        def out(i: int, finish: dict | None) -> dict:
            meta = {
                "id": obj.rid,
                "prompt_tokens": len(obj.input_ids),
                "completion_tokens": i + 1,
                "cached_tokens": 0,
                "finish_reason": finish,
            }
            return {"text": SCRIPT[i], "meta_info": meta}

        if self.hold:
            yield out(0, None)
            await self._released.wait()
            yield out(0, {"type": "abort", "message": "Abort in the middle of a request"})
            return
        last = len(SCRIPT) - 1
        if obj.stream:
            for i in range(last):
                yield out(i, None)
        yield out(last, {"type": "stop", "matched": 0})


def _handler(tokenizer: Any, hold: bool = False) -> OpenAIServingResponses:
    tm = ScriptedTokenizerManager(tokenizer, hold)
    return OpenAIServingResponses(tm, OpenAIServingChat(tm), ResponseStore())


async def _events(response: Any) -> list[dict]:
    body = b"".join([chunk async for chunk in response.body_iterator])
    events = []
    for chunk in body.split(b"\n\n")[:-1]:
        head, data = chunk.split(b"\n")
        payload = json.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + payload["type"].encode()
        events.append(payload)
    return events


def test_reasoning_items_non_stream_and_stream(qwen_tokenizer):
    async def main() -> None:
        handler = _handler(qwen_tokenizer)
        plain = await handler.create_responses(ResponsesRequest(input="Colour?"), None)
        body = json.loads(plain.body)
        assert [item["type"] for item in body["output"]] == ["reasoning", "message"]
        assert body["output"][0]["content"] == [{"text": "I think", "type": "reasoning_text"}]
        assert body["output"][1]["content"][0]["text"] == "Blue."
        assert body["text"] is None  # not text-only (SGLang)
        prompt = handler.tokenizer_manager.prompts[-1]
        assert body["usage"]["input_tokens"] == len(prompt)
        assert body["usage"]["output_tokens"] == len(SCRIPT)
        assert body["usage"]["total_tokens"] == len(prompt) + len(SCRIPT)

        streamed = await handler.create_responses(
            ResponsesRequest(input="Colour?", stream=True), None
        )
        events = await _events(streamed)
        item_events = [
            "response.output_item.added",
            "response.content_part.added",
            "{kind}.delta",
            "{kind}.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        reasoning = [e.format(kind="response.reasoning_text") for e in item_events]
        message = [e.format(kind="response.output_text") for e in item_events]
        deduped = [
            t
            for i, t in enumerate(e["type"] for e in events)
            if i == 0 or t != events[i - 1]["type"]
        ]
        assert deduped == [
            "response.created",
            "response.in_progress",
            *reasoning,
            *message,
            "response.completed",
        ]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert {e["output_index"] for e in events if "output_index" in e} == {0, 1}
        final = events[-1]["response"]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        thoughts = "".join(
            e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"
        )
        assert thoughts == final["output"][0]["content"][0]["text"] == "I think"
        assert deltas == final["output"][1]["content"][0]["text"] == "Blue."
        assert final["usage"] == body["usage"]

        # The next turn replays the reply, not its reasoning.
        second = ResponsesRequest(input="Again?", previous_response_id=body["id"])
        await handler.create_responses(second, None)
        rendered = qwen_tokenizer.decode(handler.tokenizer_manager.prompts[-1])
        assert "Colour?" in rendered and "Blue." in rendered and "I think" not in rendered
        assert rendered.index("Colour?") < rendered.index("Blue.") < rendered.index("Again?")

    asyncio.run(main())


def test_cancel_aborts_an_in_flight_stream(qwen_tokenizer):
    async def main() -> None:
        handler = _handler(qwen_tokenizer, hold=True)
        request = ResponsesRequest(input="Colour?", stream=True)
        streamed = await handler.create_responses(request, None)
        stored = handler.store.get(request.request_id)
        assert stored is not None and stored.response.status == "in_progress"
        reader = asyncio.ensure_future(_events(streamed))
        await asyncio.sleep(0)
        cancelled = await handler.cancel_responses(request.request_id)
        assert json.loads(cancelled.body)["status"] == "cancelled"
        assert handler.tokenizer_manager.aborted == [request.request_id]
        events = await reader
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["status"] == "cancelled"
        assert handler.store.get(request.request_id).response.status == "cancelled"
        again = await handler.cancel_responses(request.request_id)
        assert again.status_code == 400

    asyncio.run(main())


@pytest.mark.parametrize(
    ("previous", "status", "message"),
    [
        ("abc", 400, "Invalid 'response_id': 'abc'. Expected an ID that begins with 'resp'."),
        ("resp_x", 404, "Response with id 'resp_x' not found."),
    ],
)
def test_unknown_previous_response(qwen_tokenizer, previous, status, message):
    handler = _handler(qwen_tokenizer)
    request = ResponsesRequest(input="Hi", previous_response_id=previous)
    response = asyncio.run(handler.create_responses(request, None))
    assert response.status_code == status
    error = {"message": message, "type": "invalid_request_error", "param": "response_id"}
    assert json.loads(response.body) == {"error": {**error, "code": status}}
