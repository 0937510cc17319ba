"""The chat-completions field audit (serving/chat_fields.py): every field honoured, taken as given or
refused by name; the table, the parser, the OpenAPI document and docs/clients.md agree."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from orl.serving.chat_fields import CHAT_FIELDS, FIELDS_BY_NAME
from orl.serving.openai_api import ApiError, parse_chat_request
from orl.serving.openapi import chat_request_schema

ROOT = Path(__file__).resolve().parents[2]
RESPONSES_HEADING = "## The Responses API"  # docs/clients.md: the Responses API's table follows it
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

# The request fields of OpenAI's chat completions API (its API reference, December 2026), and orl's
# own session_id: the audit must cover each.
OPENAI_FIELDS = {
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice",
    "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
}  # fmt: skip


def parse(**fields: Any):
    return parse_chat_request(json.dumps({"messages": MESSAGES, **fields}).encode(), max_tokens_limit=64)


def refused(**fields: Any) -> dict[str, Any]:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value.body()["error"]


def test_the_table_covers_every_openai_field_and_nothing_else() -> None:
    assert set(FIELDS_BY_NAME) == OPENAI_FIELDS | {"session_id"}
    assert len(FIELDS_BY_NAME) == len(CHAT_FIELDS)


def test_an_unknown_field_is_a_400_naming_it() -> None:
    error = refused(top_k=5)
    assert (error["param"], error["code"]) == ("top_k", "unknown_parameter")
    assert "top_k" in error["message"]


@pytest.mark.parametrize("field", [f for f in CHAT_FIELDS if f.treatment == "limited"], ids=lambda f: f.name)
def test_a_limited_field_takes_its_accepted_values_and_refuses_another_by_name(field) -> None:
    needs = {"logprobs": True} if field.name == "top_logprobs" else {}
    for value in field.accepted:
        parse(**{field.name: value}, **needs)
    error = refused(**{field.name: "something else"}, **needs)
    assert (error["param"], error["code"]) == (field.name, "unsupported_parameter")
    assert field.effect in error["message"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("response_format", {"type": "xml"}),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}},
        ),
        ("n", 9),
        ("top_logprobs", 3),
        ("parallel_tool_calls", "no"),
        ("frequency_penalty", 0.5),
        ("logit_bias", {"50256": -100}),
        ("reasoning_effort", "low"),
        ("functions", [{"name": "f"}]),
        ("modalities", ["text", "audio"]),
    ],
)
def test_a_value_orl_cannot_honour_is_refused_not_ignored(name: str, value: Any) -> None:
    assert refused(**{name: value})["param"].startswith(name)


def test_response_format_json_is_parsed_into_one_canonical_constraint() -> None:
    assert parse(response_format={"type": "text"}).constraint is None
    assert parse(response_format={"type": "json_object"}).constraint == '{"type":"json_object"}'
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = {"name": "s", "schema": schema, "strict": True, "description": "d"}
    constraint = parse(response_format={"type": "json_schema", "json_schema": spec}).constraint
    assert json.loads(constraint) == {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    error = refused(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    assert error["param"] == "response_format.json_schema"


def test_json_output_and_a_forced_tool_call_are_refused_together() -> None:
    forced = {"type": "function", "function": {"name": "lookup"}}
    for choice in (forced, "required"):
        error = refused(tools=[TOOL], tool_choice=choice, response_format={"type": "json_object"})
        assert error["param"] == "response_format"
    assert parse(tools=[TOOL], tool_choice="auto", response_format={"type": "json_object"}).constraint


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("store", False, "no"),
        ("metadata", {"team": "a"}, {"team": 1}),
        ("safety_identifier", "user-1", 5),
        ("prompt_cache_retention", "24h", "forever"),
    ],
)
def test_a_field_taken_as_given_is_type_checked(name: str, good: Any, bad: Any) -> None:
    parse(**{name: good})
    assert refused(**{name: bad})["param"] == name


def test_nulls_mean_absent_for_every_field_but_messages() -> None:
    """LlamaIndex and LangChain send unset fields as null."""
    nulls = {f.name: None for f in CHAT_FIELDS if f.name != "messages"}
    req = parse(**nulls)
    assert (req.stream, req.temperature, req.tools, req.logprobs) == (False, 1.0, None, False)


def test_clients_usual_bodies_parse() -> None:
    """What the openai SDK, LangChain, the Agents SDK and stock OpenClaw send by default."""
    parse(
        model="orl-policy", stream=True, stream_options={"include_usage": True}, max_completion_tokens=8,
        tools=[TOOL], tool_choice="auto", parallel_tool_calls=True, store=False, prompt_cache_key="s:0",
        n=1, frequency_penalty=0, presence_penalty=0.0, response_format={"type": "text"},
    )  # fmt: skip
    parse(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "lookup"}})


def test_stream_options_and_strict_tools_are_checked_by_name() -> None:
    error = refused(stream=True, stream_options={"include_usage": True, "chunk_size": 3})
    assert (error["param"], error["code"]) == ("stream_options.chunk_size", "unknown_parameter")
    parse(stream=True, stream_options={"include_usage": True, "include_obfuscation": False})
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    error = refused(tools=[strict])  # strict is enforced only where the call is forced
    assert (error["param"], error["code"]) == ("tools[0].function.strict", "unsupported_parameter")
    assert "honoured only for a call that must be made" in error["message"]
    assert (
        refused(tools=[{"type": "function", "function": {**TOOL["function"], "strict": 0}}])["code"]
        == "invalid_type"
    )
    parse(tools=[{"type": "function", "function": {**TOOL["function"], "strict": False}}])
    assert parse(tools=[strict], tool_choice="none").constraint is None  # no call to constrain


def test_a_forced_strict_tool_is_constrained_to_its_parameters() -> None:
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    req = parse(tools=[strict], tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert req.constrained_call()
    assert json.loads(req.constraint or "") == {
        "type": "json_schema", "json_schema": {"name": "lookup", "schema": {"type": "object"}}
    }  # fmt: skip
    unforced = parse(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert not unforced.constrained_call() and unforced.constraint is None
    bad = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "objectx"}, "strict": True},
    }
    error = refused(tools=[bad], tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert (error["param"], error["code"]) == ("tools[0].function.parameters", "invalid_json_schema")


def test_the_openapi_document_describes_every_field_and_forbids_others() -> None:
    schema = chat_request_schema(64)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(FIELDS_BY_NAME)
    for field in CHAT_FIELDS:
        assert schema["properties"][field.name]["description"] == f"{field.treatment}: {field.effect}"


def docs_table(part: int) -> list[tuple[str, str, str]]:
    """The (field, treatment, effect) rows of docs/clients.md's table before the Responses API's
    heading (`part` 0, chat completions) or after it (1, the Responses API)."""
    text = (ROOT / "docs" / "clients.md").read_text().split(RESPONSES_HEADING)[part]
    return re.findall(r"^\| `(\w+)` \| ([a-z ]+) \| (.+) \|$", text, flags=re.MULTILINE)


def test_docs_clients_table_is_the_code_table() -> None:
    assert docs_table(0) == [(f.name, f.treatment, f.effect) for f in CHAT_FIELDS]


def test_required_forces_the_only_tool_and_asks_a_call_of_several() -> None:
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    only = parse(tools=[strict], tool_choice="required")
    assert only.forced_tool() == "lookup" and only.constrained_call() and not only.required_call()
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    held = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    strict["function"]["parameters"] = held
    several = parse(tools=[strict, other], tool_choice="required")
    assert several.forced_tool() is None and several.required_call() and not several.may_call_tools()
    calls = json.loads(several.constraint or "")["json_schema"]["schema"]["anyOf"]
    assert [c["properties"] for c in calls] == [
        {"name": {"const": "lookup"}, "arguments": held},  # strict: its parameters
        {"name": {"const": "other"}, "arguments": {"type": "object"}},
    ]
    error = refused(tools=[strict, other], tool_choice="auto")  # a strict tool whose call is not held
    assert error["param"] == "tools[0].function.strict"


def test_parallel_tool_calls_false_is_read() -> None:
    assert parse(tools=[TOOL], parallel_tool_calls=False).parallel_tool_calls is False
    assert parse(tools=[TOOL]).parallel_tool_calls is True
