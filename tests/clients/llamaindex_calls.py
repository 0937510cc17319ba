"""LlamaIndex's `OpenAILike` against an `orl serve`: plain, streamed, async, tool and structured calls.

Runs in .venv-llamaindex (tests/clients/llamaindex-requirements.txt says why), started by
tests/integration/test_client_libraries.py, which checks what this prints against what orl recorded.

Usage: python tests/clients/llamaindex_calls.py BASE_URL API_KEY
Prints one JSON object: each call's reply as the client gave it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def client(base_url: str, api_key: str, max_tokens: int) -> OpenAILike:
    return OpenAILike(
        model="orl-policy",
        api_base=f"{base_url}/v1",
        api_key=api_key,
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=2048,
        temperature=0.0,
        max_tokens=max_tokens,
        max_retries=0,
        strict=True,  # the tools' arguments held to their schemas (orl's constrained decoding)
    )


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


async def concurrent(llm: OpenAILike) -> list[str]:
    replies = await asyncio.gather(*(llm.achat(user(f"Name colour number {i}.")) for i in range(4)))
    return [str(reply.message.content) for reply in replies]


def main(base_url: str, api_key: str) -> dict[str, Any]:
    short, long = client(base_url, api_key, 16), client(base_url, api_key, 48)
    plain = short.chat(user("Say hello in three words."))
    pieces = [part.delta for part in short.stream_chat(user("Count from one to five."))]
    replies = asyncio.run(concurrent(short))
    called = long.chat_with_tools(
        [FunctionTool.from_defaults(fn=add)], user_msg="What is 2 plus 3?", tool_required=True
    )
    [selection] = long.get_tool_calls_from_response(called, error_on_no_tool_call=True)
    city = long.structured_predict(City, PromptTemplate("Name a city and its country."))
    return {
        "plain": plain.message.content,
        "streamed": [piece for piece in pieces if piece],
        "async": replies,
        "tool": {"name": selection.tool_name, "arguments": selection.tool_kwargs},
        "structured": city.model_dump(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
