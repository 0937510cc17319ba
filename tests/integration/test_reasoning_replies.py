"""Replies that think: a real `orl serve` on the real SmolLM2-135M with a thinking chat template.

The template (tests/fixtures/thinking_template.jinja) opens a `<think>` block in its generation
prompt, as DeepSeek-R1's does, and shows earlier turns' reasoning; three earlier turns with
reasoning teach the small model to close its block and then answer (greedy). Each reply must come
back with its reasoning apart from its content (chat: `reasoning_content`, plain and streamed;
Responses: a reasoning item and reasoning_text events), be recorded with the reasoning in
ResponseGenerated.reasoning_text and the answer alone in response_text (what the judge reads),
while the recorded token ids stay the whole reply, reasoning included (what the trainer trains on).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from orl.pipeline.effects.judging import judge_user_message
from orl.pipeline.processors.turn_memory import TurnMemory, complete_turn, remember_turn_event
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.reasoning import SplitReply, split_reasoning

from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, ServeProcess, serve_process
from tests.integration.test_serving_openai import wait_until_spooled_events_are_logged

pytestmark = [pytest.mark.model, pytest.mark.slow]

SHOTS = [
    ("What is 2 plus 2?", "Two plus two is four.", "2 + 2 = 4."),
    ("What is the capital of France?", "The capital of France is Paris.", "Paris is the capital of France."),
    ("What color is the sky?", "The sky is blue on a clear day.", "The sky is blue."),
]
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 48}


def conversation(question: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for asked, reasoning, answer in SHOTS:
        messages += [
            {"role": "user", "content": asked},
            {"role": "assistant", "content": answer, "reasoning_content": reasoning},
        ]
    return [*messages, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, thinking_model_dir: Path) -> Iterator[ServeProcess]:
    with serve_process(
        tmp_path_factory.mktemp("serve"), extra_env={"ORL_MODEL": str(thinking_model_dir)}
    ) as running:
        yield running


@pytest.fixture(scope="module")
def template(thinking_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(thinking_model_dir)


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


def logged(server: ServeProcess, topic: str) -> list[dict[str, Any]]:
    wait_until_spooled_events_are_logged(server)
    return asyncio.run(read_events(server.log_url, f"live.{topic}"))


def recorded_response(server: ServeProcess, request_id: str) -> dict[str, Any]:
    (event,) = [e for e in logged(server, "responses") if e["request_id"] == request_id]
    return event


def test_a_thinking_reply_comes_back_and_is_recorded_apart_from_its_answer(
    server: ServeProcess, client: openai.OpenAI, template: ChatTemplate
) -> None:
    messages = conversation("What is the capital of Italy?")
    completion = client.chat.completions.create(model="orl-policy", messages=messages, **GREEDY)
    message = completion.choices[0].message
    reasoning = (message.model_extra or {})["reasoning_content"]
    assert reasoning and message.content, (reasoning, message.content)
    assert "think>" not in reasoning + message.content

    event = recorded_response(server, completion.id)
    assert event["reasoning_text"] == reasoning and event["response_text"] == message.content
    # the trainer's tokens are the whole reply: reasoning, the closing marker, the answer
    sampled = template.decode(event["response_token_ids"])
    assert split_reasoning(sampled, "prompt") == SplitReply(reasoning, message.content)
    prompt = template.decode(event["prompt_token_ids"], skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")  # the prompt opened the block

    usage = completion.usage
    assert usage is not None and usage.completion_tokens_details is not None
    thought = usage.completion_tokens_details.reasoning_tokens
    assert thought is not None and 0 < thought < usage.completion_tokens
    ids = event["response_token_ids"]
    assert "</think>" in template.decode(ids[:thought]) and "</think>" not in template.decode(
        ids[: thought - 1]
    )

    # the judge reads the answer: the turn as the pipeline joins it from the log
    (request,) = [
        e for e in logged(server, "requests") if e["envelope"]["turn_id"] == event["envelope"]["turn_id"]
    ]
    memory = remember_turn_event(remember_turn_event(TurnMemory(), request), event)
    turn = complete_turn(memory.turns[event["envelope"]["turn_id"]])
    assert turn is not None
    judged = judge_user_message(turn["messages"], turn["response_text"], {"role": "user", "content": "ok"})
    assert message.content in judged and reasoning not in judged


def test_a_streamed_reply_streams_its_reasoning_before_its_answer(client: openai.OpenAI) -> None:
    messages = conversation("Who wrote Hamlet?")
    whole = client.chat.completions.create(model="orl-policy", messages=messages, **GREEDY).choices[0].message
    chunks = list(
        client.chat.completions.create(model="orl-policy", messages=messages, stream=True, **GREEDY)
    )
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    thought = [(d.model_extra or {}).get("reasoning_content") or "" for d in deltas]
    said = [d.content or "" for d in deltas]
    assert "".join(thought) == (whole.model_extra or {})["reasoning_content"]
    assert "".join(said) == whole.content
    last_thought = max(i for i, t in enumerate(thought) if t)
    first_said = min(i for i, s in enumerate(said) if s)
    assert last_thought < first_said
    assert sum(1 for t in thought if t) > 1  # shown as it is generated, not at the end


def test_the_responses_api_gives_a_reasoning_item_and_its_events(
    server: ServeProcess, client: openai.OpenAI
) -> None:
    *history, question = conversation("What is 3 plus 5?")
    items: list[dict[str, Any]] = []
    for message in history:  # earlier turns as Responses items: reasoning, then the message
        if message["role"] == "assistant":
            items.append(
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
                }
            )
        items.append({"role": message["role"], "content": message["content"]})
    items.append(question)
    response = client.responses.create(
        model="orl-policy",
        input=items,
        temperature=0.0,
        max_output_tokens=48,  # type: ignore[arg-type]
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    assert reasoning.content[0].text and response.output_text
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    event = recorded_response(server, response.id)
    assert (event["reasoning_text"], event["response_text"]) == (
        reasoning.content[0].text,
        response.output_text,
    )
    # the reasoning items reached the prompt as the template shows earlier reasoning
    (request,) = [e for e in logged(server, "requests") if e["request_id"] == response.id]
    assert [
        m.get("reasoning_content") for m in json.loads(request["messages_json"]) if m["role"] == "assistant"
    ] == [reasoning for _, reasoning, _ in SHOTS]

    events = list(
        client.responses.create(
            model="orl-policy",
            input=items,
            temperature=0.0,
            max_output_tokens=48,
            stream=True,  # type: ignore[arg-type]
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == done.text == reasoning.content[0].text
    assert [e.item.type for e in events if e.type == "response.output_item.added"] == ["reasoning", "message"]
    (completed,) = [e for e in events if e.type == "response.completed"]
    assert [item.type for item in completed.response.output] == ["reasoning", "message"]


def test_a_constrained_turn_does_not_think(
    server: ServeProcess, client: openai.OpenAI, template: ChatTemplate
) -> None:
    # a forced call: the block the generation prompt opened is closed empty, and the call follows
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    completion = client.chat.completions.create(
        model="orl-policy",
        messages=conversation("Add 2 and 3."),
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "add"}},
        **GREEDY,
    )
    message = completion.choices[0].message
    assert message.tool_calls and "reasoning_content" not in (message.model_extra or {})
    event = recorded_response(server, completion.id)
    assert event["reasoning_text"] is None
    prompt = template.decode(event["prompt_token_ids"], skip_special_tokens=False)
    assert prompt.endswith(
        '<|im_start|>assistant\n<think>\n</think>\n\n<tool_call>{"name": "add", "arguments": {'
    )

    # a JSON schema: the whole reply is the answer, and it validates
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    completion = client.chat.completions.create(
        model="orl-policy",
        messages=conversation("What is 2 plus 3?"),
        response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}},
        **GREEDY,
    )
    message = completion.choices[0].message
    assert isinstance(json.loads(message.content or "")["sum"], int)
    assert "reasoning_content" not in (message.model_extra or {})
