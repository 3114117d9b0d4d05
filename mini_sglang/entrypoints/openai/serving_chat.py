"""/v1/chat/completions (SGLang 0.5.4's OpenAIServingChat).

Messages are rendered with the tokenizer's Jinja chat template (add_generation_prompt=True,
the request's tools, plus `chat_template_kwargs`) into prompt token ids. With
--reasoning-parser / --tool-call-parser the reply is split into reasoning_content, content
and tool_calls (see chat_parsers.py). Sampling defaults: the request's value,
else the model's generation_config.json, else OpenAI's. Streams follow SGLang exactly: per
choice a first chunk with delta {"role":"assistant","content":""}, content chunks
(finish_reason null), after generation one chunk per choice with an empty delta and
finish_reason / matched_stop, a usage chunk (`choices: []`) only if
stream_options.include_usage, then [DONE]. Reasoning goes out as chunks with
delta.reasoning_content, calls as chunks with delta.tool_calls (the first piece of a call
has its id and name, later pieces argument text), and a choice that called a tool and
stopped naturally finishes with "tool_calls".
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from mini_sglang.entrypoints.openai.chat_parsers import (
    ChoiceStreamParser,
    parse_reply,
    request_enables_thinking,
    template_forces_reasoning,
    tool_call_constraint,
    tools_for_template,
    validate_tools,
)
from mini_sglang.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatCompletionTokenLogprob,
    ChatMessage,
    ChoiceLogprobs,
    DeltaMessage,
    TopLogprob,
)
from mini_sglang.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    common_sampling_params,
    fastapi_json_response,
    finish_fields,
    logger,
    response_fields,
    sse,
    to_openai_style_logprobs,
    usage_from_metas,
)
from mini_sglang.entrypoints.openai.serving_completions import _extra_key
from mini_sglang.managers.io_struct.generate import GenerateReqInput

# OpenAI's defaults, used when neither the request nor generation_config.json sets a value.
_DEFAULT_SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
# A template that loops over a message's content expects OpenAI's list-of-parts form;
# otherwise text parts are flattened to one string (SGLang's "string" content format).
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+(\.content|\[['\"]content['\"]\])")


class OpenAIServingChat(OpenAIServingBase):
    def __init__(self, tokenizer_manager: Any) -> None:
        super().__init__(tokenizer_manager)
        self.default_sampling_params: dict[str, Any] = dict(
            getattr(tokenizer_manager.model_config, "generation_defaults", None) or {}
        )
        if self.default_sampling_params:
            logger.info(
                "Using default chat sampling params from model generation config: %s",
                self.default_sampling_params,
            )
        template = getattr(tokenizer_manager.tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):  # named templates: the default one renders chats
            template = template.get("default", "")
        self.content_format = "openai" if _LOOPS_OVER_CONTENT.search(template) else "string"
        server_args = tokenizer_manager.server_args
        self.reasoning_parser: str | None = getattr(server_args, "reasoning_parser", None)
        self.tool_call_parser: str | None = getattr(server_args, "tool_call_parser", None)
        self.template_forces_reasoning = template_forces_reasoning(template)

    def force_reasoning(self, request: ChatCompletionRequest) -> bool:
        """The reply starts inside a think block (the template or the request says so)."""
        return self.template_forces_reasoning or request_enables_thinking(
            request, self.reasoning_parser
        )

    def _validate_request(self, request: ChatCompletionRequest) -> str | None:
        if not request.messages:
            return "Messages cannot be empty."
        error = validate_tools(request)
        if error:
            return error
        max_out = request.max_completion_tokens or request.max_tokens
        ctx = getattr(self.tokenizer_manager.server_args, "context_length", None)
        if max_out and ctx and max_out > ctx:
            return (
                f"max_completion_tokens is too large: {max_out}."
                f"This model supports at most {ctx} completion tokens."
            )
        rf = request.response_format
        if (
            rf is not None
            and rf.type == "json_schema"
            and (rf.json_schema is None or rf.json_schema.schema_ is None)
        ):
            return "schema_ is required for json_schema response format request."
        return None

    # ---- prompt ------------------------------------------------------------------------
    def render_messages(self, request: ChatCompletionRequest) -> list[int]:
        """The prompt token ids of `request.messages` through the chat template (also the
        Responses API's prompts); ValueError for a conversation it cannot render, or one
        with image parts (render_messages_with_images takes those)."""
        ids, images = self.render_messages_with_images(request)
        if images:
            raise ValueError("Image content parts are supported in chat completions only.")
        return ids

    def render_messages_with_images(self, request: ChatCompletionRequest) -> tuple[list[int], list]:
        """(prompt ids, the image_url parts' URLs in order). Each image part becomes the
        model's image token where the template puts it: an {"type": "image"} part for a
        template that loops over content, the token text inside the string otherwise."""
        tokenizer = self.tokenizer_manager.tokenizer
        if tokenizer is None:
            raise ValueError("--skip-tokenizer-init is set: chat completions need a tokenizer.")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "The tokenizer has no chat template; use /v1/completions or pass a model "
                "whose tokenizer_config.json defines one."
            )
        images: list = []
        messages = [self._message_dict(m, images) for m in request.messages]
        prefix = None
        if request.continue_final_message and messages[-1]["role"] == "assistant":
            prefix = messages.pop()["content"]
        kwargs = dict(request.chat_template_kwargs or {})
        kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        tools = tools_for_template(request)

        def render(tools: list[dict] | None) -> Any:
            return tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, tools=tools, **kwargs
            )

        try:
            try:
                ids = render(tools)
            except Exception:
                if not tools:
                    raise
                # Templates such as Mistral's want the {"function": ...} wrapper (SGLang).
                ids = render([t if "function" in t else {"function": t} for t in tools])
        except Exception as e:  # Jinja raises on conversations a template refuses
            raise ValueError(f"Failed to apply the chat template: {e}") from None
        # transformers 5 returns a BatchEncoding; older versions a list of ids.
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        ids = list(ids)
        if prefix:
            encoded = tokenizer.encode(prefix)
            if encoded and encoded[0] == tokenizer.bos_token_id:
                encoded = encoded[1:]
            ids += encoded
        return ids, images

    def _message_dict(self, message: Any, images: list) -> dict[str, Any]:
        """The message as the chat template takes it; image_url parts' URLs are appended
        to `images`."""
        msg = message.model_dump()
        content = msg.get("content")
        if content is None:
            msg["content"] = ""
        elif isinstance(content, list):
            msg["content"] = self._content_parts(content, images)
        # Templates expect the arguments of earlier calls as a dict, clients send a JSON
        # string (OpenAI's format).
        for call in msg.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])
        return {k: v for k, v in msg.items() if v is not None}

    def _content_parts(self, content: list[dict], images: list) -> str | list[dict]:
        mm = self.tokenizer_manager.mm_processor
        parts: list[dict] = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url" and mm is not None:
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str) or not url:
                    raise ValueError("An image_url part needs image_url.url (a URL or data URL).")
                images.append(url)
                parts.append({"type": "image"})
            elif mm is None:
                raise ValueError(
                    "Only text content parts are supported (the model "
                    f"{self.tokenizer_manager.server_args.served_model_name} takes no images)."
                )
            else:
                raise ValueError(f"Content parts of type {kind!r} are not supported.")
        if self.content_format == "openai":
            return parts
        token = mm.image_token if mm is not None else ""
        return " ".join(p["text"] if p["type"] == "text" else token for p in parts)

    def _convert_to_internal_request(self, request: ChatCompletionRequest) -> GenerateReqInput:
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False  # call markers may be special tokens
        prompt_ids, images = self.render_messages_with_images(request)
        params = common_sampling_params(request)
        constraint = tool_call_constraint(request)
        if constraint is not None:
            if any(params.get(k) for k in ("regex", "ebnf", "json_schema", "structural_tag")):
                logger.warning("Constrained decoding is not compatible with tool calls.")
            else:
                params["json_schema"] = constraint
        for name, default in _DEFAULT_SAMPLING.items():
            value = getattr(request, name)
            params[name] = (
                value if value is not None else self.default_sampling_params.get(name, default)
            )
        params = {k: v for k, v in params.items() if v is not None}
        # None means unbounded (the scheduler clamps it to the context).
        params["max_new_tokens"] = request.max_tokens or request.max_completion_tokens
        return GenerateReqInput(
            input_ids=prompt_ids,
            image_data=images or None,
            modalities=["image"] * len(images) if images else None,
            sampling_params=params,
            return_logprob=request.logprobs,
            logprob_start_len=-1,
            top_logprobs_num=request.top_logprobs or 0,
            return_text_in_logprobs=True,
            stream=request.stream,
            rid=request.rid,
            priority=request.priority,
            extra_key=_extra_key(request),
            # features this server lacks: the TokenizerManager answers SGLang's 400
            return_hidden_states=request.return_hidden_states,
            custom_logit_processor=request.custom_logit_processor,
        )

    # ---- logprobs ----------------------------------------------------------------------
    @staticmethod
    def _chat_logprobs(meta: Mapping[str, Any], start: int) -> ChoiceLogprobs:
        """Output tokens from `start` on, in OpenAI's chat format (token, bytes, logprob,
        top_logprobs)."""
        lp = to_openai_style_logprobs(
            output_token_logprobs=meta.get("output_token_logprobs", [])[start:],
            output_top_logprobs=(meta.get("output_top_logprobs") or [])[start:],
        )
        content = []
        for i, (token, logprob) in enumerate(zip(lp.tokens, lp.token_logprobs)):
            tops = lp.top_logprobs[i] if i < len(lp.top_logprobs) else None
            content.append(
                ChatCompletionTokenLogprob(
                    token=token,
                    bytes=list(token.encode("utf-8")),
                    logprob=logprob,
                    top_logprobs=[
                        TopLogprob(token=t, bytes=list(t.encode("utf-8")), logprob=v)
                        for t, v in (tops or {}).items()
                    ],
                )
            )
        return ChoiceLogprobs(content=content)

    # ---- non-stream --------------------------------------------------------------------
    def _build_response(self, request: ChatCompletionRequest, ret: list[dict]) -> Response:
        choices = []
        for idx, item in enumerate(ret):
            meta = item["meta_info"]
            reply = parse_reply(
                item["text"],
                meta.get("finish_reason"),
                request,
                self.reasoning_parser,
                self.tool_call_parser,
                self.force_reasoning(request),
            )
            finish_reason, matched = finish_fields({"finish_reason": reply.finish_reason})
            choices.append(
                ChatCompletionResponseChoice(
                    index=idx,
                    message=ChatMessage(
                        role="assistant",
                        content=reply.text or None,
                        reasoning_content=reply.reasoning_text or None,
                        tool_calls=reply.tool_calls,
                    ),
                    logprobs=self._chat_logprobs(meta, 0) if request.logprobs else None,
                    finish_reason=finish_reason,  # type: ignore[arg-type]
                    matched_stop=matched,
                )
            )
        response = ChatCompletionResponse(
            choices=choices, **response_fields(ret, request, self.enable_cache_report)
        )
        return fastapi_json_response(response)

    # ---- stream ------------------------------------------------------------------------
    async def _generate_stream(
        self, adapted: GenerateReqInput, request: ChatCompletionRequest, raw_request: Request
    ) -> AsyncIterator[bytes]:
        streams: dict[int, _ChoiceStream] = {}  # choice index -> its stream state
        finish: dict[int, tuple[str, int | str | None]] = {}  # in the order choices finish
        last_id = ""

        def chunk(rid: str, index: int, delta: DeltaMessage, **kw: Any) -> bytes:
            choice = ChatCompletionResponseStreamChoice(index=index, delta=delta, **kw)
            return sse(
                ChatCompletionStreamResponse(
                    id=rid, created=int(time.time()), model=request.model, choices=[choice]
                )
            )

        async for content in self.tokenizer_manager.generate_request(adapted, raw_request):
            index: int = content.get("index", 0)
            meta: dict[str, Any] = content["meta_info"]
            rid = last_id = meta["id"]
            finish_reason, matched = finish_fields(meta)
            if finish_reason:
                finish[index] = (finish_reason, matched)
            stream = streams.get(index)
            if stream is None:
                parser = ChoiceStreamParser(
                    request,
                    self.reasoning_parser,
                    self.tool_call_parser,
                    self.force_reasoning(request),
                )
                stream = streams[index] = _ChoiceStream(parser)
                yield chunk(rid, index, DeltaMessage(role="assistant", content=""))
            stream.meta = meta
            for delta, kw in self._stream_deltas(stream, content, request, finish_reason):
                yield chunk(rid, index, delta, **kw)
        for index, (finish_reason, matched) in finish.items():
            if finish_reason == "stop" and streams[index].parser.has_tool_calls:
                finish_reason = "tool_calls"  # matched_stop stays (SGLang's stream does so)
            yield chunk(
                last_id,
                index,
                DeltaMessage(),
                finish_reason=finish_reason,
                matched_stop=matched,
            )
        if request.stream_options and request.stream_options.include_usage:
            metas = [streams[i].meta for i in sorted(streams)]
            usage = usage_from_metas(metas, request.n, self.enable_cache_report)
            yield sse(
                ChatCompletionStreamResponse(
                    id=last_id,
                    created=int(time.time()),
                    model=request.model,
                    choices=[],
                    usage=usage,
                )
            )

    def _stream_deltas(
        self,
        stream: _ChoiceStream,
        content: dict[str, Any],
        request: ChatCompletionRequest,
        finish_reason: str | None,
    ) -> Iterator[tuple[DeltaMessage, dict[str, Any]]]:
        """The deltas (with their extra choice fields) that one output of a choice adds."""
        delta = content["text"][stream.sent_text :]
        stream.sent_text = len(content["text"])
        parsed = stream.parser.feed(delta, finished=finish_reason is not None)
        if parsed.reasoning_text:
            yield DeltaMessage(reasoning_content=parsed.reasoning_text), {}
        if stream.parser.tools_active:
            # SGLang sends answer text and call pieces without logprobs here.
            if parsed.normal_text:
                yield DeltaMessage(content=parsed.normal_text), {}
            for call in parsed.tool_calls:
                yield DeltaMessage(tool_calls=[call]), {}
            return
        if not parsed.normal_text:
            # Tokens without new answer text (e.g. a stop string forming, reasoning)
            # keep their logprobs for the next content chunk.
            return
        logprobs = None
        if request.logprobs:
            meta = content["meta_info"]
            logprobs = self._chat_logprobs(meta, stream.sent_logprobs)
            stream.sent_logprobs = len(meta.get("output_token_logprobs", []))
        yield DeltaMessage(content=parsed.normal_text), {"logprobs": logprobs}


@dataclass
class _ChoiceStream:
    """One streamed choice: its parsers, how much text and how many logprobs were sent,
    and its latest meta_info."""

    parser: ChoiceStreamParser
    sent_text: int = 0
    sent_logprobs: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
