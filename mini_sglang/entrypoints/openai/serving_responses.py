"""/v1/responses (SGLang 0.5.4's OpenAIServingResponses, for models without harmony).

Request -> chat messages (`instructions` as a system message, then the stored
conversation of `previous_response_id` with its reply as an assistant message, then
`input`) -> prompt ids through /v1/chat/completions' template rendering -> one generation
-> a `response` object whose output is a reasoning item (with --reasoning-parser, when the
reply has reasoning) and a message item with one output_text part.

- Store (`store`, default true): the response and its input messages go to the
  ResponseStore, in progress from the start, so that GET /v1/responses/{id},
  `previous_response_id` and cancel find it.
- Stream: SSE events `event: <type>\\ndata: <json>\\n\\n` numbered by sequence_number:
  response.created, response.in_progress, then per output item output_item.added,
  content_part.added, its text deltas (response.reasoning_text.delta /
  response.output_text.delta), the matching *.done, content_part.done, output_item.done,
  and last response.completed. No [DONE].
- Background (`background`, needs `store`): answered at once with the queued response;
  the generation runs in a task that updates the stored one.
- Cancel: only a queued / in-progress response (else SGLang's 400 "Cannot cancel a
  synchronous response."): it becomes "cancelled" and its generation is aborted.
- Errors: OpenAI's nested envelope {"error": {"message", "type", "param", "code"}};
  an id without the "resp" prefix is a 400, an unknown one a 404 (SGLang's texts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import orjson_response
from mini_sglang.entrypoints.openai.chat_parsers import ChoiceStreamParser, parse_reply
from mini_sglang.entrypoints.openai.protocol import ChatCompletionRequest
from mini_sglang.entrypoints.openai.protocol_responses import (
    InputTokensDetails,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextContent,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from mini_sglang.entrypoints.openai.response_store import ResponseStore, StoredResponse
from mini_sglang.entrypoints.openai.serving_base import (
    ClosingStreamingResponse,
    fastapi_json_response,
)
from mini_sglang.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_sglang.entrypoints.openai.serving_completions import _extra_key
from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.unicode_check import json_safe

logger = logging.getLogger("mini_sglang")

# SGLang's Responses defaults where the request leaves a value unset.
_DEFAULT_TEMPERATURE = 0.7
_DEFAULT_TOP_P = 1.0
_TEXT_PART_TYPES = ("input_text", "output_text", "text")
_INPUT_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def responses_error(
    message: str,
    err_type: str = "invalid_request_error",
    status_code: int = 400,
    param: str | None = None,
) -> Response:
    """OpenAI's nested error envelope, as SGLang sends it for /v1/responses."""
    error = {"message": json_safe(message), "type": err_type, "param": param}
    return orjson_response({"error": {**error, "code": status_code}}, status_code)


def _invalid_id_error(response_id: str) -> Response:
    return responses_error(
        f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.",
        param="response_id",
    )


def _not_found_error(response_id: str) -> Response:
    return responses_error(
        f"Response with id '{response_id}' not found.", status_code=404, param="response_id"
    )


def _refusal(e: Exception) -> Response:
    """A request refused before it ran: a 400 for bad input; the scheduler's own status
    (503 "The request queue is full.", 500) in the nested envelope, typed by the status's
    phrase as SGLang's HTTPException handler types it for /v1/responses."""
    if isinstance(e, SchedulerRefused):
        return responses_error(e.message, HTTPStatus(e.status_code).phrase, e.status_code)
    return responses_error(str(e))


def _new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output_items(
    reasoning_text: str | None, text: str, reasoning_id: str, message_id: str
) -> list[ResponseOutputItem]:
    """A reasoning item if there is reasoning, then a message item if there is text."""
    items: list[ResponseOutputItem] = []
    if reasoning_text:
        items.append(
            ResponseReasoningItem(
                id=reasoning_id, content=[ResponseReasoningTextContent(text=reasoning_text)]
            )
        )
    if text:
        items.append(
            ResponseOutputMessage(
                id=message_id, content=[ResponseOutputText(text=text)], status="completed"
            )
        )
    return items


def _usage(meta: dict[str, Any]) -> ResponseUsage:
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=meta.get("cached_tokens", 0)),
        output_tokens=completion,
        total_tokens=prompt + completion,
    )


async def _last_output(gen: AsyncIterator[dict], last: dict | None = None) -> dict | None:
    """The last output of `gen` (`last` if it yields nothing more)."""
    async for out in gen:
        last = out
    return last


def _input_message(item: dict[str, Any]) -> dict[str, Any]:
    """One input item as a chat message; ValueError for what is not a text message."""
    kind = item.get("type", "message")
    if kind != "message":
        raise ValueError(f"Input items of type '{kind}' are not supported.")
    role = _INPUT_ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise ValueError(
            f"Invalid input message role: {item.get('role')!r}; expected one of "
            f"{sorted(_INPUT_ROLES)}."
        )
    content = item.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"Only text input parts are supported, not {kind!r}.")
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        content = parts
    elif not isinstance(content, str):
        raise ValueError("An input message's content must be a string or a list of parts.")
    return {"role": role, "content": content}


class _Turn:
    """One request on its way: the request, its chat form and its prompt's messages."""

    def __init__(
        self, request: ResponsesRequest, chat_request: ChatCompletionRequest, messages: list
    ) -> None:
        self.request = request
        self.chat_request = chat_request
        self.messages = messages
        self.created_at = int(time.time())
        self.reasoning_id = _new_item_id("rs")
        self.message_id = _new_item_id("msg")

    def response(
        self, status: str, output: list | None = None, usage: ResponseUsage | None = None
    ) -> ResponsesResponse:
        return ResponsesResponse.from_request(
            self.request, self.created_at, output or [], status, usage
        )


class _StreamEvents:
    """The SSE events of one streamed response, numbered in order: its output items (a
    reasoning item, a message) are opened, receive text deltas and are closed."""

    def __init__(self, turn: _Turn) -> None:
        self.turn = turn
        self.sequence_number = 0
        self.texts = {"reasoning": "", "message": ""}
        self.open_item: str | None = None  # the kind of the item being streamed
        self.output_index = -1

    def event(self, kind: str, **fields: Any) -> bytes:
        fields.update(sequence_number=self.sequence_number, type=kind)
        self.sequence_number += 1
        data = orjson.dumps(dict(sorted(fields.items())))
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _item(self, kind: str, status: str) -> dict:
        turn = self.turn
        if kind == "reasoning":
            return ResponseReasoningItem(id=turn.reasoning_id, status=status).model_dump()
        return ResponseOutputMessage(id=turn.message_id, content=[], status=status).model_dump()

    @staticmethod
    def _part(kind: str, text: str) -> dict:
        if kind == "reasoning":
            return ResponseReasoningTextContent(text=text).model_dump()
        return ResponseOutputText(text=text).model_dump()

    def _ids(self, kind: str) -> dict:
        item_id = self.turn.reasoning_id if kind == "reasoning" else self.turn.message_id
        return {"item_id": item_id, "output_index": self.output_index, "content_index": 0}

    def delta(self, kind: str, piece: str) -> list[bytes]:
        """The events for `piece` of `kind`'s text: the item opened first (closing the
        other) unless it is the one being streamed."""
        if not piece:
            return []
        events = [] if self.open_item == kind else self._open(kind)
        self.texts[kind] += piece
        if kind == "reasoning":
            events.append(
                self.event("response.reasoning_text.delta", delta=piece, **self._ids(kind))
            )
        else:
            events.append(
                self.event(
                    "response.output_text.delta", delta=piece, logprobs=[], **self._ids(kind)
                )
            )
        return events

    def _open(self, kind: str) -> list[bytes]:
        events = self.close()
        self.output_index += 1
        self.open_item = kind
        events.append(
            self.event(
                "response.output_item.added",
                item=self._item(kind, "in_progress"),
                output_index=self.output_index,
            )
        )
        events.append(
            self.event("response.content_part.added", part=self._part(kind, ""), **self._ids(kind))
        )
        return events

    def close(self) -> list[bytes]:
        """The events that complete the item being streamed (none if there is none)."""
        kind, self.open_item = self.open_item, None
        if kind is None:
            return []
        turn, text, ids = self.turn, self.texts[kind], self._ids(kind)
        if kind == "reasoning":
            done = self.event("response.reasoning_text.done", text=text, **ids)
            final = ResponseReasoningItem(
                id=turn.reasoning_id,
                content=[ResponseReasoningTextContent(text=text)],
                status="completed",
            )
        else:
            done = self.event("response.output_text.done", text=text, logprobs=[], **ids)
            final = ResponseOutputMessage(
                id=turn.message_id, content=[ResponseOutputText(text=text)], status="completed"
            )
        return [
            done,
            self.event("response.content_part.done", part=self._part(kind, text), **ids),
            self.event(
                "response.output_item.done", item=final.model_dump(), output_index=self.output_index
            ),
        ]


class OpenAIServingResponses:
    """The handler of POST /v1/responses, GET /v1/responses/{id} and
    POST /v1/responses/{id}/cancel; prompts are rendered by `chat` (the server's
    /v1/chat/completions handler), responses kept in `store`."""

    def __init__(
        self, tokenizer_manager: Any, chat: OpenAIServingChat, store: ResponseStore
    ) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.chat = chat
        self.store = store
        # background generations by response id (a reference keeps each task alive)
        self.background_tasks: dict[str, asyncio.Task] = {}

    # ---- create ----------------------------------------------------------------------
    async def create_responses(self, request: ResponsesRequest, raw_request: Request) -> Response:
        prev = self._previous(request)
        if isinstance(prev, Response):
            return prev
        if request.background and not request.store:
            return responses_error("background can only be used when `store` is true")
        try:
            turn, adapted = self._prepare(request, prev)
        except ValueError as e:
            logger.exception("Error in preprocessing prompt inputs")
            return responses_error(str(e))
        if request.store:
            status = "queued" if request.background else "in_progress"
            self.store.put(StoredResponse(turn.response(status), turn.messages))
        if request.background:
            self._start_background(turn, adapted)
            return fastapi_json_response(turn.response("queued"))
        gen = self.tokenizer_manager.generate_request(adapted, raw_request)
        try:
            first = await gen.__anext__()  # errors before generation are a plain 400
        except StopAsyncIteration:
            first = None
        except (ValueError, TypeError, SchedulerRefused) as e:
            await gen.aclose()
            self.store.pop(request.request_id)  # refused before it ran: nothing to keep
            return _refusal(e)
        except RequestAborted:
            await gen.aclose()
            self._mark_unfinished(turn, "cancelled")
            return responses_error("Client disconnected")
        if request.stream:
            return ClosingStreamingResponse(
                self._stream(turn, first, gen),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "Connection": "keep-alive"},
            )
        try:
            last = await _last_output(gen, first)
        except (ValueError, TypeError) as e:
            self._mark_unfinished(turn, "failed")
            return responses_error(str(e))
        except RequestAborted:  # the client is gone; the answer goes nowhere
            self._mark_unfinished(turn, "cancelled")
            return responses_error("Client disconnected")
        finally:
            await gen.aclose()
        return fastapi_json_response(self._finish(turn, last))

    def _previous(self, request: ResponsesRequest) -> StoredResponse | Response | None:
        """The stored response previous_response_id names (None without one), or the error
        response for an id that is malformed or unknown."""
        prev_id = request.previous_response_id
        if prev_id is None:
            return None
        if not prev_id.startswith("resp_"):
            return _invalid_id_error(prev_id)
        prev = self.store.get(prev_id)
        return _not_found_error(prev_id) if prev is None else prev

    def _prepare(
        self, request: ResponsesRequest, prev: StoredResponse | None
    ) -> tuple[_Turn, GenerateReqInput]:
        """The turn and its generation request; ValueError for what cannot be served."""
        messages = self._input_messages(request, prev)
        chat_request = ChatCompletionRequest(
            model=request.model or "default", messages=messages, stream=bool(request.stream)
        )
        prompt_ids = self.chat.render_messages(chat_request)
        temperature, top_p = request.temperature, request.top_p
        params: dict[str, Any] = {
            "temperature": _DEFAULT_TEMPERATURE if temperature is None else temperature,
            "top_p": _DEFAULT_TOP_P if top_p is None else top_p,
            "frequency_penalty": request.frequency_penalty,
            "presence_penalty": request.presence_penalty,
            "stop": request.stop,
            "top_k": request.top_k,
            "min_p": request.min_p,
            "repetition_penalty": request.repetition_penalty,
        }
        params = {k: v for k, v in params.items() if v is not None}
        SamplingParams.from_dict(params)  # a bad value is a 400 before anything runs
        # None means unbounded (the scheduler clamps it to the context).
        params["max_new_tokens"] = request.max_output_tokens
        adapted = GenerateReqInput(
            input_ids=prompt_ids,
            sampling_params=params,
            stream=bool(request.stream),
            rid=request.request_id,
            priority=request.priority,
            extra_key=_extra_key(request),
        )
        return _Turn(request, chat_request, messages), adapted

    @staticmethod
    def _input_messages(request: ResponsesRequest, prev: StoredResponse | None) -> list[dict]:
        """instructions, the previous conversation and its reply, then the new input."""
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        if prev is not None:
            messages.extend(prev.messages)
            # The previous reply (its reasoning is left out, as SGLang does).
            for item in prev.response.output:
                if isinstance(item, ResponseOutputMessage):
                    text = "".join(part.text for part in item.content)
                    messages.append({"role": "assistant", "content": text})
        if isinstance(request.input, str):
            messages.append({"role": "user", "content": request.input})
            return messages
        messages.extend(_input_message(item) for item in request.input)
        return messages

    # ---- finishing -------------------------------------------------------------------
    def _finish(
        self,
        turn: _Turn,
        out: dict | None,
        reasoning_text: str | None = None,
        text: str | None = None,
    ) -> ResponsesResponse:
        """The final response from the last output (non-stream: its text is parsed here;
        stream: the texts already sent), stored unless it was cancelled meanwhile."""
        meta = out["meta_info"] if out else {"prompt_tokens": 0, "completion_tokens": 0}
        if text is None:
            reply = parse_reply(
                out["text"] if out else "",
                meta.get("finish_reason"),
                turn.chat_request,
                self.chat.reasoning_parser,
                None,
                self.chat.force_reasoning(turn.chat_request),
            )
            reasoning_text, text = reply.reasoning_text, reply.text
        output = _output_items(reasoning_text, text, turn.reasoning_id, turn.message_id)
        status = "completed"
        stored = self.store.get(turn.request.request_id) if turn.request.store else None
        if stored is not None and stored.response.status == "cancelled":
            status = "cancelled"
        response = turn.response(status, output, _usage(meta))
        if turn.request.store:
            self.store.put(StoredResponse(response, turn.messages))
        return response

    def _mark_unfinished(self, turn: _Turn, status: str) -> None:
        """A stored in-flight response that ended without a reply gets `status` (a
        cancelled one stays cancelled)."""
        stored = self.store.get(turn.request.request_id) if turn.request.store else None
        if stored is not None and stored.response.status in ("queued", "in_progress"):
            stored.response.status = status  # type: ignore[assignment]

    # ---- stream ----------------------------------------------------------------------
    async def _stream(
        self, turn: _Turn, first: dict | None, gen: AsyncIterator[dict]
    ) -> AsyncIterator[bytes]:
        events = _StreamEvents(turn)
        initial = turn.response("in_progress").model_dump()
        yield events.event("response.created", response=initial)
        yield events.event("response.in_progress", response=initial)
        parser = ChoiceStreamParser(
            turn.chat_request,
            self.chat.reasoning_parser,
            None,
            self.chat.force_reasoning(turn.chat_request),
        )
        last = first
        sent = 0
        try:
            out = first
            while out is not None:
                last = out
                finished = out["meta_info"].get("finish_reason") is not None
                delta = out["text"][sent:]
                sent = len(out["text"])
                parsed = parser.feed(delta, finished=finished)
                for kind, piece in (
                    ("reasoning", parsed.reasoning_text),
                    ("message", parsed.normal_text),
                ):
                    for e in events.delta(kind, piece):
                        yield e
                out = await gen.__anext__() if not finished else None
        except StopAsyncIteration:
            pass
        except RequestAborted:
            self._mark_unfinished(turn, "cancelled")
            return  # the client is gone; nobody reads further events
        except (ValueError, TypeError) as e:
            self._mark_unfinished(turn, "failed")
            yield events.event("error", code=400, message=json_safe(str(e)), param=None)
            return
        finally:
            await gen.aclose()
        for e in events.close():
            yield e
        texts = events.texts
        final = self._finish(turn, last, texts["reasoning"] or None, texts["message"])
        yield events.event("response.completed", response=final.model_dump())

    # ---- background ------------------------------------------------------------------
    def _start_background(self, turn: _Turn, adapted: GenerateReqInput) -> None:
        response_id = turn.request.request_id
        task = asyncio.create_task(
            self._run_background(turn, adapted), name=f"create_{response_id}"
        )
        self.background_tasks[response_id] = task
        task.add_done_callback(lambda _: self.background_tasks.pop(response_id, None))

    async def _run_background(self, turn: _Turn, adapted: GenerateReqInput) -> None:
        stored = self.store.get(turn.request.request_id)
        if stored is not None and stored.response.status == "queued":
            stored.response.status = "in_progress"
        try:
            last = await _last_output(self.tokenizer_manager.generate_request(adapted, None))
        except asyncio.CancelledError:
            self._mark_unfinished(turn, "cancelled")
            raise
        except Exception as e:  # noqa: BLE001 - the stored response reports it
            logger.exception("Background request failed for %s", turn.request.request_id)
            self._mark_unfinished(turn, "failed")
            stored = self.store.get(turn.request.request_id)
            if stored is not None:
                stored.response.error = {"code": "server_error", "message": str(e)}
            return
        self._finish(turn, last)

    # ---- retrieve / cancel -----------------------------------------------------------
    async def retrieve_responses(self, response_id: str) -> Response:
        if not response_id.startswith("resp_"):
            return _invalid_id_error(response_id)
        stored = self.store.get(response_id)
        if stored is None:
            return _not_found_error(response_id)
        return fastapi_json_response(stored.response)

    async def cancel_responses(self, response_id: str) -> Response:
        if not response_id.startswith("resp_"):
            return _invalid_id_error(response_id)
        stored = self.store.get(response_id)
        if stored is None:
            return _not_found_error(response_id)
        if stored.response.status not in ("queued", "in_progress"):
            return responses_error("Cannot cancel a synchronous response.")
        stored.response.status = "cancelled"
        # The response id is the generation's rid.
        self.tokenizer_manager.abort_request(rid=response_id)
        task = self.background_tasks.get(response_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return fastapi_json_response(stored.response)
