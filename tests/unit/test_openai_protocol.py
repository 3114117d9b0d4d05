"""Request models of the OpenAI routes: SGLang 0.5.4's normalisation before validation."""

from __future__ import annotations

from mini_sglang.entrypoints.openai.protocol import ChatCompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def test_json_schema_shorthand_becomes_the_json_schema_object():
    schema = {
        "title": "Person",
        "type": "object",
        "properties": {"name": {"type": "string"}, "strict": {"default": True}},
    }
    req = ChatCompletionRequest(
        messages=MESSAGES, response_format={"type": "json_schema", "schema": schema}
    )
    js = req.response_format.json_schema
    # SGLang names it after the schema's title, and a "strict" property defaulting to true
    # turns strict on and leaves the schema
    assert js.name == "Person" and js.strict is True
    assert js.schema_ == {
        "title": "Person",
        "type": "object",
        "properties": {"name": {"type": "string"}},
    }


def test_json_schema_shorthand_defaults_and_precedence():
    req = ChatCompletionRequest(
        messages=MESSAGES, response_format={"type": "json_schema", "schema": {"type": "object"}}
    )
    js = req.response_format.json_schema
    assert (js.name, js.strict, js.schema_) == ("Schema", False, {"type": "object"})
    # A json_schema object wins; the stray schema is dropped.
    full = {"name": "x", "schema": {"type": "string"}}
    req = ChatCompletionRequest(
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": full, "schema": {"type": "object"}},
    )
    assert req.response_format.json_schema.schema_ == {"type": "string"}
    # Other types are untouched.
    req = ChatCompletionRequest(messages=MESSAGES, response_format={"type": "json_object"})
    assert req.response_format.json_schema is None


def test_reasoning_object_sets_effort_and_thinking():
    req = ChatCompletionRequest(messages=MESSAGES, reasoning={"effort": "high", "enabled": "yes"})
    assert req.reasoning_effort == "high"
    assert req.chat_template_kwargs == {"thinking": True}
    # The request's own kwarg wins; an unknown effort and a false flag change nothing.
    req = ChatCompletionRequest(
        messages=MESSAGES,
        reasoning={"reasoning_effort": "max", "enable": True},
        chat_template_kwargs={"thinking": False, "x": 1},
    )
    assert req.reasoning_effort == "medium"
    assert req.chat_template_kwargs == {"thinking": False, "x": 1}
    req = ChatCompletionRequest(messages=MESSAGES, reasoning={"enabled": False})
    assert req.chat_template_kwargs is None
