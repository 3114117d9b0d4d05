"""Tool-call parsers: SGLang 0.5.4's non-stream results (including malformed JSON), streams
that give the same calls however the text is split, the partial-JSON parser under them,
the tool_choice schemas and the --tool-call-parser / --reasoning-parser flag checks."""

from __future__ import annotations

import json
import logging

import pytest

from mini_sglang.entrypoints.openai.protocol import Tool, ToolChoice
from mini_sglang.function_call.function_call_parser import (
    FunctionCallParser,
    get_json_schema_constraint,
)
from mini_sglang.function_call.json_array_parser import JsonArrayParser
from mini_sglang.function_call.partial_json import (
    MalformedJSON,
    parse_partial,
    stable_prefix,
)


def _tool(name: str, parameters: dict | None = None) -> Tool:
    return Tool(function={"name": name, "parameters": parameters})


TOOLS = [_tool("get_weather"), _tool("add")]


def _calls(items) -> list[tuple[int, str | None, str]]:
    return [(c.tool_index, c.name, c.parameters) for c in items]


def _stream(parser: FunctionCallParser, pieces: list[str]) -> tuple[str, list]:
    """Concatenate a stream the way a client does: answer text, and per call index the
    name (from its first piece) and the argument pieces."""
    text, calls = "", {}
    chunks = [parser.parse_stream_chunk(p) for p in pieces] + [parser.finish()]
    for normal, items in chunks:
        text += normal
        for item in items:
            if item.tool_index not in calls:
                assert item.name and item.parameters == "", item  # the naming piece
                calls[item.tool_index] = [item.name, ""]
            else:
                assert item.name is None, item
                calls[item.tool_index][1] += item.parameters
    assert sorted(calls) == list(range(len(calls)))  # stream indices count from 0
    return text, [tuple(calls[i]) for i in sorted(calls)]


def _all_splits(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


# ---- non-stream (SGLang's exact results) -------------------------------------------------
QWEN_TWO = (
    'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name":"add","arguments":{"a":1,"b":[2.5,"日本"]}}\n</tool_call>'
)


def test_qwen25_non_stream() -> None:
    parser = FunctionCallParser(TOOLS, "qwen25")
    text, calls = parser.parse_non_stream(QWEN_TWO)
    assert text == "Let me check."  # stripped; tool_index stays -1 as in SGLang
    assert _calls(calls) == [
        (-1, "get_weather", '{"city": "Paris"}'),
        (-1, "add", '{"a": 1, "b": [2.5, "日本"]}'),  # re-serialised, ensure_ascii off
    ]
    assert parser.has_tool_call(QWEN_TWO) and not parser.has_tool_call("<tool_call>{}")
    assert FunctionCallParser(TOOLS, "qwen").parse_non_stream("no call\n") == ("no call\n", [])
    # Without tools nothing is parsed.
    assert FunctionCallParser([], "qwen25").parse_non_stream(QWEN_TWO) == (QWEN_TWO, [])


def test_qwen25_malformed_and_unknown_calls(caplog: pytest.LogCaptureFixture) -> None:
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
    parser = FunctionCallParser(TOOLS, "qwen25")
    with caplog.at_level(logging.WARNING, logger="mini_sglang"):
        # A bad block is skipped (warning), the good one kept.
        text, calls = parser.parse_non_stream("Hi " + bad + "\n" + unknown + "\n" + good)
    assert text == "Hi" and _calls(calls) == [(-1, "add", '{"a": 2}')]
    assert "Failed to parse JSON part" in caplog.text and "undefined function: rm_rf" in caplog.text
    # No call decodes: the whole text is the answer (SGLang); a cut-off block is no call.
    for text in ("Hi " + bad, unknown, good[:-5]):
        assert parser.parse_non_stream(text) == (text, [])


def test_llama3_non_stream() -> None:
    parser = FunctionCallParser(TOOLS, "llama3")
    two = '{"name": "get_weather", "parameters": {"city": "Oslo"}};{"name": "add", "arguments": {}}'
    assert _calls(parser.parse_non_stream("<|python_tag|>" + two)[1]) == [
        (-1, "get_weather", '{"city": "Oslo"}'),
        (-1, "add", "{}"),
    ]
    text, calls = parser.parse_non_stream('Sure <|python_tag|>{"name": "add"} then ')
    assert text == "Sure then" and _calls(calls) == [(-1, "add", "{}")]
    # A reply that starts with "{" is a call without the tag.
    assert _calls(parser.parse_non_stream('{"name": "add", "parameters": {"a": 1}}')[1]) == [
        (-1, "add", '{"a": 1}')
    ]
    # Malformed: skipped up to the next {"name": ...; nothing decodes -> all text.
    text, calls = parser.parse_non_stream('<|python_tag|>{"name": bad};{"name": "add"}')
    assert _calls(calls) == [(-1, "add", "{}")]
    assert parser.parse_non_stream("<|python_tag|>{oops") == ("<|python_tag|>{oops", [])
    assert parser.parse_non_stream("Hello") == ("Hello", [])


# ---- streams ---------------------------------------------------------------------------
STREAM_CASES = {
    "qwen25": [
        QWEN_TWO,
        '<tool_call>\n{"name": "add", "arguments": {"s": "a\\"b\\\\c\\u00e9\\ud83d\\ude00", '
        '"n": -1.5e-3, "t": true, "z": null, "e": [], "o": {}}}\n</tool_call>\n',
        "Just an answer, no tools.  \n",
        "Almost a call <tool_c",
    ],
    "llama3": [
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}};'
        '{"name": "add", "parameters": {"a": [1, 2]}}',
        'I will call. <|python_tag|>{"name": "add", "parameters": {"a": 1}}  Done. ',
        '{"name": "add", "parameters": {"x": "y"}}',
        "Hello there",
    ],
}


@pytest.mark.parametrize("name", sorted(STREAM_CASES))
def test_stream_equals_non_stream_at_every_split(name: str) -> None:
    for text in STREAM_CASES[name]:
        normal, calls = FunctionCallParser(TOOLS, name).parse_non_stream(text)
        expected = (normal, [(c.name, c.parameters) for c in calls])
        for pieces in _all_splits(text):
            got = _stream(FunctionCallParser(TOOLS, name), pieces)
            assert got == expected, (name, pieces)


def test_stream_sends_arguments_before_the_call_ends() -> None:
    parser = FunctionCallParser(TOOLS, "qwen25")
    assert _calls(parser.parse_stream_chunk('Hm <tool_call>\n{"name": "add", ')[1]) == [
        (0, "add", "")
    ]
    assert _calls(parser.parse_stream_chunk('"arguments": {"a": "xy')[1]) == [
        (0, None, '{"a": "xy')
    ]
    assert _calls(parser.parse_stream_chunk('z"}}\n</tool_call>')[1]) == [(0, None, 'z"}')]


def test_stream_malformed_unknown_and_cut_off_calls() -> None:
    # Malformed JSON after the name: the call is not continued; the next one still is.
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1,,}}\n</tool_call>\n'
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"c": 1}}\n</tool_call>'
    )
    for pieces in _all_splits(text):
        _, calls = _stream(FunctionCallParser(TOOLS, "qwen25"), pieces)
        assert calls[-1] == ("get_weather", '{"c": 1}') and ("rm_rf", "{}") not in calls
        # A call named before its JSON broke keeps valid (closed) arguments.
        assert all(isinstance(json.loads(args), dict) for _, args in calls)
    # Cut off mid-arguments: finish() closes the JSON as SGLang does, so it still decodes.
    parser = FunctionCallParser(TOOLS, "qwen25")
    _, calls = _stream(parser, ['<tool_call>\n{"name": "add", "arguments": {"a": [1, {"b": "x'])
    assert calls == [("add", '{"a": [1, {"b": "x"}]}')]


def test_json_array_stream_matches_its_decoding() -> None:
    """tool_choice required / named: the constrained reply is a JSON array; the stream
    numbers calls 0.. like the non-stream decoding in the chat endpoint."""
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "add", "parameters": {}}]'
    expected = [(c["name"], json.dumps(c["parameters"])) for c in json.loads(text)]
    for pieces in _all_splits(text):
        parser = FunctionCallParser(TOOLS, None, detector=JsonArrayParser())
        assert _stream(parser, pieces) == ("", expected)


# ---- partial JSON ------------------------------------------------------------------------
def test_partial_json_prefixes_are_final() -> None:
    doc = '{"a": "x\\"\\u00e9\\ud83d\\ude00", "b": [1, -2.5e3, true, null, {}], "c": {"d": []}}'
    final = json.dumps(json.loads(doc), ensure_ascii=False)
    previous = ""
    for i in range(len(doc) + 1):
        value, end, complete = parse_partial(doc[:i])
        prefix = "" if value is None else stable_prefix(value)
        assert final.startswith(prefix) and prefix.startswith(previous), doc[:i]
        previous = prefix
    assert (previous, end, complete) == (final, len(doc), True)
    assert parse_partial('{"a": 1} tail') == ({"a": 1}, 8, True)
    for bad in ('{"a" 1}', "{x", "[1,]", "tx", '{"a": 01}'):
        with pytest.raises(MalformedJSON):
            parse_partial(bad)


# ---- tool_choice constraints, parser names -------------------------------------------------
def test_json_schema_constraints() -> None:
    params = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {}}}
    tools = [_tool("f", params), _tool("g")]
    named = get_json_schema_constraint(tools, ToolChoice(function={"name": "g"}))
    assert named == {
        "type": "array",
        "minItems": 1,
        "maxItems": 1,
        "items": {
            "properties": {
                "name": {"type": "string", "enum": ["g"]},
                "parameters": {"type": "object", "properties": {}},
            },
            "required": ["name", "parameters"],
        },
    }
    required = get_json_schema_constraint(tools, "required")
    assert required is not None and required["$defs"] == {"A": {}}
    assert [s["properties"]["name"]["enum"] for s in required["items"]["anyOf"]] == [["f"], ["g"]]
    assert get_json_schema_constraint(tools, "auto") is None
    clash = [_tool("h", {"$defs": {"A": {"type": "string"}}}), _tool("f", params)]
    with pytest.raises(ValueError, match="multiple schemas"):
        get_json_schema_constraint(clash, "required")
    with pytest.raises(ValueError, match="Unsupported tool_call_parser"):
        FunctionCallParser(TOOLS, "nope")


def test_parser_flags(caplog: pytest.LogCaptureFixture) -> None:
    from mini_sglang.server_args import ServerArgs, prepare_server_args

    args = ServerArgs(model_path="m", reasoning_parser="qwen3", tool_call_parser="llama3")
    assert (args.reasoning_parser, args.tool_call_parser) == ("qwen3", "llama3")
    with pytest.raises(ValueError, match="--tool-call-parser: invalid choice 'qwen2'"):
        ServerArgs(model_path="m", tool_call_parser="qwen2")
    # SGLang's names for formats mini-sglang lacks: accepted, named in a warning, ignored.
    with caplog.at_level(logging.WARNING):
        args = ServerArgs(model_path="m", tool_call_parser="mistral", reasoning_parser="gpt-oss")
    assert (args.reasoning_parser, args.tool_call_parser) == (None, None)
    assert "--tool-call-parser='mistral' is not supported" in caplog.text
    with pytest.raises(SystemExit) as info:
        prepare_server_args(["--model-path", "m", "--reasoning-parser", "r2"])
    assert info.value.code == 2
