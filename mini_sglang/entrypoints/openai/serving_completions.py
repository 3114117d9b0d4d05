"""/v1/completions (SGLang 0.5.4's OpenAIServingCompletion, compactly).

The prompt is a string, a list of strings, a list of token ids or a list of such lists;
n > 1 samples each prompt n times (choice k belongs to prompt k // n). Non-stream responses
are one CompletionResponse; streams send one chunk per TokenizerManager event with the text
delta (the last content chunk of each choice carries finish_reason / matched_stop), then a
usage chunk with `choices: []` only if stream_options.include_usage, then [DONE].
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from mini_sglang.entrypoints.openai.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamResponse,
    LogProbs,
)
from mini_sglang.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    common_sampling_params,
    fastapi_json_response,
    finish_fields,
    response_fields,
    sse,
    to_openai_style_logprobs,
    usage_from_metas,
)
from mini_sglang.managers.io_struct.generate import GenerateReqInput


class OpenAIServingCompletion(OpenAIServingBase):
    def _validate_request(self, request: CompletionRequest) -> str | None:
        prompt = request.prompt
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            return "Prompt cannot be empty"
        return None

    def _convert_to_internal_request(self, request: CompletionRequest) -> GenerateReqInput:
        params = common_sampling_params(request)
        params.update(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
            json_schema=params.get("json_schema") or request.json_schema,
        )
        params = {k: v for k, v in params.items() if v is not None}
        params["max_new_tokens"] = request.max_tokens
        prompt = request.prompt
        is_text = isinstance(prompt, str) or isinstance(prompt[0], str)
        return GenerateReqInput(
            text=prompt if is_text else None,  # type: ignore[arg-type]
            input_ids=None if is_text else prompt,  # type: ignore[arg-type]
            sampling_params=params,
            return_logprob=request.logprobs is not None,
            top_logprobs_num=request.logprobs or 0,
            # The prompt's logprobs are only computed when they are echoed.
            logprob_start_len=0 if request.echo and request.logprobs else -1,
            return_text_in_logprobs=True,
            stream=request.stream,
            rid=request.rid,
            priority=request.priority,
            extra_key=_extra_key(request),
            # features this server lacks: the TokenizerManager answers SGLang's 400
            return_hidden_states=request.return_hidden_states,
            custom_logit_processor=request.custom_logit_processor,
        )

    # ---- echo -------------------------------------------------------------------------
    def _echo_text(self, request: CompletionRequest, prompt_index: int) -> str:
        """The prompt text echoed in front of choice texts (token-id prompts decoded)."""
        prompt = request.prompt
        if isinstance(prompt, str):
            return prompt
        item = prompt[prompt_index] if not isinstance(prompt[0], int) else prompt
        if isinstance(item, str):
            return item
        return self.tokenizer_manager.tokenizer.decode(item, skip_special_tokens=True)

    def _logprobs(
        self, request: CompletionRequest, meta: dict, with_input: bool, start: int
    ) -> LogProbs | None:
        if request.logprobs is None:
            return None
        return to_openai_style_logprobs(
            input_token_logprobs=meta.get("input_token_logprobs") if with_input else None,
            input_top_logprobs=meta.get("input_top_logprobs") if with_input else None,
            output_token_logprobs=meta.get("output_token_logprobs", [])[start:],
            output_top_logprobs=meta.get("output_top_logprobs", [])[start:],
        )

    # ---- non-stream --------------------------------------------------------------------
    def _build_response(self, request: CompletionRequest, ret: list[dict]) -> Response:
        choices = []
        for idx, item in enumerate(ret):
            meta = item["meta_info"]
            text = item["text"]
            if request.echo:
                text = self._echo_text(request, idx // request.n) + text
            finish_reason, matched = finish_fields(meta)
            choices.append(
                CompletionResponseChoice(
                    index=idx,
                    text=text,
                    logprobs=self._logprobs(request, meta, request.echo, 0),
                    finish_reason=finish_reason,  # type: ignore[arg-type]
                    matched_stop=matched,
                )
            )
        response = CompletionResponse(
            choices=choices, **response_fields(ret, request, self.enable_cache_report)
        )
        return fastapi_json_response(response)

    # ---- stream ------------------------------------------------------------------------
    async def _generate_stream(
        self, adapted: GenerateReqInput, request: CompletionRequest, raw_request: Request
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        sent_text: dict[int, int] = {}  # choice index -> length of generated text sent
        sent_logprobs: dict[int, int] = {}
        last_meta: dict[int, dict[str, Any]] = {}  # choice index -> its latest meta_info
        last_id = ""
        async for content in self.tokenizer_manager.generate_request(adapted, raw_request):
            index: int = content.get("index", 0)
            meta: dict[str, Any] = content["meta_info"]
            last_id = meta["id"]
            last_meta[index] = meta
            first = index not in sent_text
            text = content["text"]
            delta = text[sent_text.get(index, 0) :]
            sent_text[index] = len(text)
            if first and request.echo:
                delta = self._echo_text(request, index // request.n) + delta
            start = sent_logprobs.get(index, 0)
            logprobs = self._logprobs(request, meta, first and request.echo, start)
            sent_logprobs[index] = len(meta.get("output_token_logprobs", []))
            finish_reason, matched = finish_fields(meta)
            choice = CompletionResponseChoice(
                index=index,
                text=delta,
                logprobs=logprobs,
                finish_reason=finish_reason,  # type: ignore[arg-type]
                matched_stop=matched,
            )
            chunk = CompletionStreamResponse(
                id=meta["id"], created=created, model=request.model, choices=[choice]
            )
            yield sse(chunk)
        if request.stream_options and request.stream_options.include_usage:
            metas = [last_meta[i] for i in sorted(last_meta)]
            usage = usage_from_metas(metas, request.n, self.enable_cache_report)
            chunk = CompletionStreamResponse(
                id=last_id, created=created, model=request.model, choices=[], usage=usage
            )
            # SGLang drops null fields of this one chunk (prompt_tokens_details when unset).
            yield sse(chunk, exclude_none=True)


def _extra_key(request: Any) -> str | None:
    """cache_salt + extra_key (SGLang concatenates both when given)."""
    parts = [v for v in (request.cache_salt, request.extra_key) if isinstance(v, str) and v]
    return "".join(parts) if parts else None
