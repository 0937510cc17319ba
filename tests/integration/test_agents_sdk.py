"""The OpenAI Agents SDK (openai-agents, from PyPI) runs one-tool agents against a real `orl serve`.

The SDK speaks the Responses API by default (`OpenAIResponsesModel`). Two agents, each forced to call
its tool on its first turn (`tool_choice`), on the real SmolLM2-135M on CPU, greedy:

- a strict tool (the SDK's default) that ends the run (`stop_on_first_tool`): orl decodes the forced
  call's arguments under the tool's schema, so the tool runs with valid integers and its result is the
  agent's answer;
- a non-strict tool in the SDK's full loop: the SDK resets tool_choice to auto after the call, sends
  the tool's output back with the whole conversation, and the model answers. Both turns must be
  recorded in one session, linked by their messages as any resent conversation is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, ServeProcess, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path) -> Iterator[ServeProcess]:
    with serve_process(tmp_path_factory.mktemp("serve")) as running:
        yield running


def run_agent(server: ServeProcess, *, strict: bool) -> tuple[Any, list[tuple[int, int]]]:
    """(the run's result, the (a, b) each call of the tool got)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    calls: list[tuple[int, int]] = []

    @function_tool(strict_mode=strict)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="calculator",
        instructions="You add numbers with the add tool, then say the sum.",
        tools=[add],
        model=OpenAIResponsesModel(model="orl-policy", openai_client=client),
        model_settings=ModelSettings(tool_choice="add", temperature=0.0, max_tokens=32),
        tool_use_behavior="stop_on_first_tool" if strict else "run_llm_again",
    )
    run = Runner.run(agent, "What is 2 plus 3?", max_turns=3, run_config=RunConfig(tracing_disabled=True))
    return asyncio.run(run), calls


def recorded(server: ServeProcess, topic: str, after: int) -> list[dict[str, Any]]:
    return asyncio.run(read_events(server.log_url, f"live.{topic}"))[after:]


def test_a_strict_tool_is_called_with_arguments_that_fit_its_schema_and_answers(server: ServeProcess) -> None:
    before = len(recorded(server, "responses", 0))
    result, calls = run_agent(server, strict=True)
    assert len(calls) == 1 and all(isinstance(n, int) for n in calls[0]), calls
    assert str(result.final_output) == str(sum(calls[0]))  # the tool's result ends the run
    [response] = recorded(server, "responses", before)
    [call] = json.loads(response["tool_calls_json"])
    assert json.loads(call["function"]["arguments"]) == {"a": calls[0][0], "b": calls[0][1]}
    assert json.loads(response["sampling"]["constraint"])["json_schema"]["name"] == "add"


def test_the_full_tool_loop_is_recorded_as_one_session(server: ServeProcess) -> None:
    before = len(recorded(server, "requests", 0))
    result, _ = run_agent(server, strict=False)
    assert isinstance(result.final_output, str)
    requests, responses = recorded(server, "requests", before), recorded(server, "responses", before)
    assert len(requests) == len(responses) == 2
    first, second = requests
    assert second["envelope"]["session_id"] == first["envelope"]["session_id"]
    assert (second["turn_index"], second["previous_turn_id"]) == (1, first["envelope"]["turn_id"])
    [call] = json.loads(responses[0]["tool_calls_json"])
    sent_back = json.loads(second["messages_json"])
    assert [m["role"] for m in sent_back] == ["system", "user", "assistant", "tool"]
    assert sent_back[2]["tool_calls"] == [call]  # the call as orl recorded it, resent by the SDK
    assert sent_back[3]["tool_call_id"] == call["id"]  # the tool's output, or the SDK's error text
    assert responses[1]["response_text"] == result.final_output
