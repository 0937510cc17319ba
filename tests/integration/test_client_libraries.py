"""Client libraries from PyPI against a real `orl serve` on the real SmolLM2-135M (CPU): LangChain's
`ChatOpenAI` (langchain-openai), the OpenAI Agents SDK (openai-agents), LiteLLM and LlamaIndex's
`OpenAILike` (in a venv of its own: tests/clients/). Every turn they make must be answered and
recorded as any client's is.

LiteLLM and LlamaIndex: plain, streamed, async (four concurrent), a strict tool call and structured
output each. LlamaIndex's calls are forced with tool_choice required (one tool) and send
parallel_tool_calls false.

LangChain: plain, streamed, async (concurrent), tool (`bind_tools`, a strict forced call) and
structured (`with_structured_output(method="json_schema")`) calls over chat completions.

The Agents SDK speaks the Responses API by default (`OpenAIResponsesModel`). Two agents, each forced
to call its tool on its first turn (`tool_choice`), greedy:

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
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, ServeProcess, serve_process
from tests.integration.test_serving_openai import SMALL_INTEGERS, wait_until_spooled_events_are_logged

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
    """The topic's events after its first `after`, read once the server's spool is empty: every turn
    answered so far was committed to the spool before its answer, so all its events are then logged."""
    wait_until_spooled_events_are_logged(server)
    return asyncio.run(read_events(server.log_url, f"live.{topic}"))[after:]


def chat_openai(server: ServeProcess, **settings: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="orl-policy", base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, **settings
    )


def test_langchain_plain_streamed_and_async_calls_are_answered_and_recorded(server: ServeProcess) -> None:
    before = len(recorded(server, "responses", 0))
    llm = chat_openai(server, temperature=0.0, max_tokens=16)
    plain = llm.invoke("Say hello in three words.")
    chunks = list(llm.stream("Count from one to five."))
    concurrent = asyncio.run(_gather(llm.ainvoke(f"Name colour number {i}.") for i in range(4)))
    assert isinstance(plain.content, str) and plain.content
    assert len([c for c in chunks if c.content]) > 1, "tokens must arrive as several chunks"
    assert all(isinstance(reply.content, str) and reply.content for reply in concurrent)
    texts = [r["response_text"] for r in recorded(server, "responses", before)]
    assert len(texts) == 6
    assert texts[0] == plain.content and texts[1] == "".join(str(c.content) for c in chunks)
    assert sorted(texts[2:]) == sorted(str(reply.content) for reply in concurrent)


async def _gather(calls: Any) -> list[Any]:
    return list(await asyncio.gather(*calls))


def test_langchain_tool_and_structured_output_calls(server: ServeProcess) -> None:
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class City(BaseModel):
        name: str = Field(max_length=24)
        country: str = Field(max_length=24)

    before = len(recorded(server, "responses", 0))
    llm = chat_openai(server, temperature=0.0, max_tokens=48)
    called = llm.bind_tools([add], tool_choice="add", strict=True).invoke("What is 2 plus 3?")
    [call] = called.tool_calls
    assert call["name"] == "add" and all(isinstance(call["args"][k], int) for k in ("a", "b")), call
    city = llm.with_structured_output(City, method="json_schema").invoke("Name a city and its country.")
    assert isinstance(city, City) and city.name
    tool_turn, structured_turn = recorded(server, "responses", before)
    assert json.loads(tool_turn["tool_calls_json"])[0]["function"]["name"] == "add"
    assert City.model_validate_json(structured_turn["response_text"]) == city
    assert structured_turn["sampling"]["constraint"] is not None  # constrained: never trained on


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


def litellm_calls(server: ServeProcess) -> dict[str, Any]:
    """LiteLLM's completion calls, as an app using LiteLLM with orl as an OpenAI-compatible provider
    makes them: plain, streamed, async (concurrent), a strict forced tool call, and a pydantic
    response_format."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price table: no fetch
    import litellm
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=24)
        country: str = Field(max_length=24)

    provider = {"model": "openai/orl-policy", "api_base": f"{server.base_url}/v1", "api_key": API_KEY}
    short = {**provider, "temperature": 0.0, "max_tokens": 16, "num_retries": 0}

    def ask(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    async def concurrent() -> list[Any]:
        return list(
            await asyncio.gather(
                *(litellm.acompletion(messages=ask(f"Name colour {i}."), **short) for i in range(4))
            )
        )

    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "strict": True,
            "parameters": SMALL_INTEGERS,
        },
    }
    plain = litellm.completion(messages=ask("Say hello in three words."), **short)
    chunks = list(litellm.completion(messages=ask("Count from one to five."), stream=True, **short))
    replies = asyncio.run(concurrent())
    called = litellm.completion(
        messages=ask("What is 2 plus 3?"), tools=[tool], tool_choice={"type": "function", "function": {"name": "add"}},
        **{**short, "max_tokens": 48},
    )  # fmt: skip
    structured = litellm.completion(
        messages=ask("Name a city and its country."), response_format=City, **{**short, "max_tokens": 48}
    )
    [call] = called.choices[0].message.tool_calls
    return {
        "plain": plain.choices[0].message.content,
        "streamed": [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content],
        "async": [reply.choices[0].message.content for reply in replies],
        "tool": {"name": call.function.name, "arguments": json.loads(call.function.arguments)},
        "structured": City.model_validate_json(structured.choices[0].message.content).model_dump(),
    }


LLAMAINDEX_PYTHON = Path(__file__).parents[2] / ".venv-llamaindex" / "bin" / "python"


def llamaindex_calls(server: ServeProcess) -> dict[str, Any]:
    """tests/clients/llamaindex_calls.py in LlamaIndex's own venv (its openai pin excludes the Agents
    SDK's), the same five kinds of call through `OpenAILike`."""
    assert LLAMAINDEX_PYTHON.exists(), "LlamaIndex's venv is missing: run scripts/install.sh --dev"
    script = Path(__file__).parents[1] / "clients" / "llamaindex_calls.py"
    done = subprocess.run(
        [str(LLAMAINDEX_PYTHON), str(script), server.base_url, API_KEY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("calls", [litellm_calls, llamaindex_calls], ids=["litellm", "llamaindex"])
def test_litellm_and_llamaindex_calls_are_answered_and_recorded(server: ServeProcess, calls: Any) -> None:
    before = len(recorded(server, "responses", 0))
    got = calls(server)
    assert got["plain"] and len(got["streamed"]) > 1, "tokens must arrive as several chunks"
    assert len(got["async"]) == 4 and all(got["async"])
    assert got["tool"]["name"] == "add" and set(got["tool"]["arguments"]) == {"a", "b"}  # strict: its schema
    assert got["structured"]["name"] and got["structured"]["country"]
    turns = recorded(server, "responses", before)
    assert len(turns) == 8  # plain, streamed, 4 async, tool, structured: each recorded once
    plain, streamed, *concurrent, tool_turn, structured_turn = turns
    assert plain["response_text"] == got["plain"] and streamed["response_text"] == "".join(got["streamed"])
    assert sorted(t["response_text"] for t in concurrent) == sorted(got["async"])
    [call] = json.loads(tool_turn["tool_calls_json"])
    assert json.loads(call["function"]["arguments"]) == got["tool"]["arguments"]
    # LiteLLM asks for response_format; LlamaIndex for a forced strict call of a tool named City
    [output] = [
        c["function"]["arguments"] for c in json.loads(structured_turn["tool_calls_json"] or "[]")
    ] or [structured_turn["response_text"]]
    assert json.loads(output) == got["structured"]
    assert structured_turn["sampling"]["constraint"] is not None  # constrained: never trained on
