"""Request validation: every malformed body gets a 400 that names what is wrong."""

import json

import pytest
from orl.serving.openai_api import ApiError, parse_chat_request
from orl.serving.tool_calls import forced_call, forced_call_prefix, parse_reply


def parse(body: object, limit: int = 1024):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_chat_request(raw, max_tokens_limit=limit)


def rejected(body: object) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    assert info.value.body()["error"]["type"] == "invalid_request_error"
    return info.value


def test_a_plain_request_parses_with_openai_defaults() -> None:
    req = parse({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert (req.temperature, req.top_p, req.max_tokens, req.stream, req.stop) == (1.0, 1.0, None, False, ())


def test_sampling_parameters_and_stream_options_are_read() -> None:
    req = parse(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.2,
            "top_p": 0.9,
            "max_completion_tokens": 7,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "session_id": "abc",
            "user": "u1",
        }
    )
    assert (req.temperature, req.top_p, req.max_tokens, req.stop, req.seed) == (0.2, 0.9, 7, ("END",), 3)
    assert req.include_usage and req.stream and req.session_id == "abc" and req.user == "u1"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "r"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 9}, "n"),
        # found by tests/fuzz: each of these was accepted (n=true) or crashed the handler (a 500)
        ({"messages": [{"role": "user", "content": "x"}], "n": True}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**63}, "seed"),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_obfuscation": 0.0}},
            "stream_options.include_obfuscation",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5, "max_tokens": "x"},
            "max_tokens",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
        ),
    ],
)
def test_bad_fields_are_named(body: dict, param: str) -> None:
    assert rejected(body).param == param


def test_invalid_json_and_utf8_are_400() -> None:
    assert rejected(b"{not json").code == "invalid_json"
    assert rejected(b'{"messages": "\xff"}').code == "invalid_encoding"
    assert rejected([1, 2]).code == "invalid_type"


def test_unencodable_json_is_400_not_a_crash() -> None:
    """Found by tests/fuzz: both parsed as JSON, then failed deep in the handler with a 500."""
    lone_surrogate = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    assert rejected(lone_surrogate).code == "invalid_encoding"
    huge_integer = b'{"messages": [], "seed": ' + b"9" * 5000 + b"}"
    assert rejected(huge_integer).code == "invalid_value"
    # a surrogate pair is one character, not an error
    pair = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert parse(pair).messages[0]["content"] == "\U0001f600"


def test_tool_calls_are_parsed_into_openai_shape() -> None:
    text = 'Let me check. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    reply = parse_reply(text, "req-1")
    assert reply.content == "Let me check."
    assert reply.tool_calls[0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert reply.tool_calls[0]["id"] == parse_reply(text, "req-1").tool_calls[0]["id"]


def test_malformed_calls_stay_content_and_forced_prefix_completes_a_call() -> None:
    assert parse_reply("<tool_call>{oops</tool_call>", "r").tool_calls == []
    call = forced_call("add", '"a": 2, "b": 3}}\n</tool_call>', "r").tool_calls[0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    broken = forced_call("add", '"a": 2, oops', "r").tool_calls[0]
    assert broken["function"]["arguments"] == '{"a": 2, oops'  # returned as written, never dropped


def test_a_constrained_forced_call_leaves_the_whole_arguments_object_to_the_model() -> None:
    """A strict tool: the prefix stops before the object, which the grammar makes the model write."""
    assert forced_call_prefix("add", constrained=True) + "{" == forced_call_prefix("add")
    call = forced_call("add", '{"a":2,"b":3}', "r", constrained=True).tool_calls[0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
