"""response_format json_schema and json_object on `orl serve` with the real SmolLM2 model (issue 49).

Constrained decoding (serving/policy/output_constraint.py, llguidance) must give JSON that validates
against the request's schema every time, streamed or not; the turn is recorded with its constraint,
and the logprobs returned are the recorded ones, from the masked distribution it sampled from.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.integration.serve_process import API_KEY, ServeProcess, serve_process
from tests.integration.test_serving_openai import wait_for_events

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Every number is bounded: a small model at temperature 1 may write digits up to the token limit in
# an unbounded one (the grammar allows any length), as it did in the first runs of this test.
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "verdict": {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "count": {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 0, "maximum": 100},
            "done": {"type": "boolean"},
        },
        "required": ["count", "done"],
        "additionalProperties": False,
    },
    "city": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    },
}
PROMPTS = [
    "Describe a person.",
    "Is the sky blue?",
    "Tag this text: the cat sat on the mat.",
    "How many apples are in a basket of five?",
    "Name a city you like.",
    "Answer in JSON.",
    "Hello!",
    "What is two plus two?",
    "Tell me about Paris.",
    "Give me an example.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path) -> Iterator[ServeProcess]:
    with serve_process(tmp_path_factory.mktemp("serve-json")) as running:
        yield running


def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def json_schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def test_fifty_json_schema_requests_all_return_json_that_validates(server: ServeProcess) -> None:
    cases = [(name, prompt) for name in SCHEMAS for prompt in PROMPTS]
    assert len(cases) == 50

    def ask(case: tuple[str, str]) -> tuple[str, str, str]:
        name, prompt = case
        reply = client(server).chat.completions.create(
            model="orl-policy",
            messages=[{"role": "user", "content": prompt}],
            response_format=json_schema_format(name),  # type: ignore[arg-type]
            max_tokens=160,
            temperature=1.0,
        )
        return name, reply.choices[0].message.content or "", reply.choices[0].finish_reason

    with ThreadPoolExecutor(max_workers=8) as pool:  # the server batches them
        replies = list(pool.map(ask, cases))
    valid = 0
    for name, content, finish in replies:
        assert finish == "stop", (name, content, finish)
        jsonschema.validate(json.loads(content), SCHEMAS[name])
        valid += 1
    print(f"\n{valid} of {len(cases)} replies are JSON that validates against their schema")
    assert valid == len(cases)


def test_a_constrained_turn_is_recorded_with_its_constraint_and_exact_logprobs(server: ServeProcess) -> None:
    raw = client(server).chat.completions.with_raw_response.create(
        model="orl-policy",
        messages=[{"role": "user", "content": "Name a city."}],
        response_format=json_schema_format("city"),  # type: ignore[arg-type]
        max_tokens=80,
        logprobs=True,
    )
    reply = raw.parse()
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMAS["city"])
    (response,) = wait_for_events(server, "responses", lambda e: e["request_id"] == reply.id)
    constraint = json.loads(response["sampling"]["constraint"])
    assert constraint == {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMAS["city"]}}
    recorded = [struct.unpack("<f", struct.pack("<f", lp))[0] for lp in response["response_logprobs"]]
    returned = [token.logprob for token in reply.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert returned == recorded
    assert all(lp <= 0 for lp in returned)


def test_json_object_streamed_adds_up_to_one_json_object(server: ServeProcess) -> None:
    chunks = client(server).chat.completions.create(
        model="orl-policy",
        messages=[{"role": "user", "content": "Describe your day as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=120,
        stream=True,
    )
    text, finish = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    else:  # the token limit may cut an object the model keeps open; what came must still be its prefix
        assert finish == "length" and text.startswith("{"), (finish, text)


def test_a_schema_that_cannot_be_enforced_is_a_400_naming_response_format(server: ServeProcess) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(
            model="orl-policy",
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "objectx"}},
            },
            max_tokens=8,
        )
    error = info.value.body  # the SDK hands over the body's "error" object
    assert (error["param"], error["code"]) == ("response_format", "invalid_json_schema")


def test_a_forced_strict_tool_call_always_has_arguments_that_validate(server: ServeProcess) -> None:
    """tools[].function.strict with tool_choice naming it: the arguments object is decoded under the
    tool's parameters schema, at temperature 1, streamed or not; the turn is recorded as constrained."""
    tool = {
        "type": "function",
        "function": {"name": "record", "parameters": SCHEMAS["person"], "strict": True},
    }
    results = []
    for index, prompt in enumerate(PROMPTS[:6]):
        request = {
            "model": "orl-policy",
            "messages": [{"role": "user", "content": prompt}],
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "record"}},
            "max_tokens": 80,
            "temperature": 1.0,
        }
        if index % 2:
            chunks = list(client(server).chat.completions.create(**request, stream=True))
            calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
            reply_id, arguments = chunks[0].id, "".join(c.function.arguments or "" for c in calls)
            finish = next(chunk.choices[0].finish_reason for chunk in chunks[::-1] if chunk.choices)
        else:
            reply = client(server).chat.completions.create(**request)
            call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
            reply_id, arguments, finish = reply.id, call.function.arguments, reply.choices[0].finish_reason
        assert finish == "tool_calls", (prompt, arguments)
        jsonschema.validate(json.loads(arguments), SCHEMAS["person"])
        results.append(reply_id)
    for reply_id in results:
        (response,) = wait_for_events(server, "responses", lambda e, r=reply_id: e["request_id"] == r)
        constraint = json.loads(response["sampling"]["constraint"])
        assert constraint["json_schema"] == {"name": "record", "schema": SCHEMAS["person"]}
