"""The Responses API's field audit (serving/responses_api.py): every request field the openai SDK can
send is honoured, taken as given or refused by name; the table, the parser, the OpenAPI document and
docs/clients.md agree."""

import json
from typing import Any

import pytest
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from orl.serving.openai_api import ApiError
from orl.serving.openapi import responses_request_schema
from orl.serving.responses_api import RESPONSES_FIELDS, RESPONSES_FIELDS_BY_NAME, parse_responses_request

from tests.unit.test_chat_fields import docs_table


def parse(**fields: Any):
    body = json.loads(json.dumps({"input": "hi", **fields}))
    return parse_responses_request(body).chat_request([], max_tokens_limit=64)


def refused(**fields: Any) -> dict[str, Any]:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value.body()["error"]


def test_the_table_covers_every_field_of_the_installed_openai_sdk_and_nothing_else() -> None:
    """The SDK's create params (stream is split into its own overloads there)."""
    assert set(RESPONSES_FIELDS_BY_NAME) == set(ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert len(RESPONSES_FIELDS_BY_NAME) == len(RESPONSES_FIELDS)


@pytest.mark.parametrize(
    "field", [f for f in RESPONSES_FIELDS if f.treatment == "limited"], ids=lambda f: f.name
)
def test_a_limited_field_takes_its_accepted_values_and_refuses_another_by_name(field) -> None:
    for value in field.accepted:
        parse(**{field.name: value})
    error = refused(**{field.name: "something else"})
    assert (error["param"], error["code"]) == (field.name, "unsupported_parameter")
    assert field.effect in error["message"]


def test_input_items_become_chat_messages() -> None:
    req = parse(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Add 1 "}, {"type": "input_text", "text": "and 2."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}], "id": "msg_1"},
            {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "call_2", "name": "add", "arguments": '{"b": 2}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "1"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "2"}]},
        ],
    )  # fmt: skip
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"b": 2}'}},
    ]
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1 and 2."},
        {"role": "assistant", "content": "Calling.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2"},
    ]


def test_settings_reach_the_chat_request_under_their_chat_names() -> None:
    tool = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    req = parse(
        tools=[tool], tool_choice={"type": "function", "name": "add"}, max_output_tokens=9,
        temperature=0.3, top_p=0.5, include=["message.output_text.logprobs"], user="u1",
    )  # fmt: skip
    assert req.tools == [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert (req.forced_tool(), req.max_tokens, req.temperature, req.top_p, req.logprobs, req.user) == (
        "add", 9, 0.3, 0.5, True, "u1"
    )  # fmt: skip
    constrained = parse(text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}})
    assert json.loads(constrained.constraint or "") == {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}
    }  # fmt: skip


def test_a_bad_value_is_named_as_the_responses_api_names_it() -> None:
    error = refused(max_output_tokens=65)
    assert error["param"] == "max_output_tokens" and "max_output_tokens" in error["message"]
    assert refused(input=[{"role": "tool", "content": "x"}])["param"] == "input[0].role"
    assert refused(tool_choice="required")["param"] == "tool_choice"  # required needs tools
    assert refused(text={"format": {"type": "yaml"}})["param"] == "text.format.type"


def test_the_openapi_document_describes_every_field_and_forbids_others() -> None:
    schema = responses_request_schema(64)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(RESPONSES_FIELDS_BY_NAME)
    for field in RESPONSES_FIELDS:
        assert schema["properties"][field.name]["description"] == f"{field.treatment}: {field.effect}"


def test_docs_clients_responses_table_is_the_code_table() -> None:
    assert docs_table(1) == [(f.name, f.treatment, f.effect) for f in RESPONSES_FIELDS]
