"""The policy backend interface every orl server uses (in-process transformers, SGLang over HTTP).

A backend turns prompt token ids into sampled token ids with their logprobs, scores fixed responses,
and hot-swaps checkpoints. It knows nothing about events: the server records what it returns.

Logprob semantics (the trainer relies on them):

* `Generation.logprobs[i]` is log p(token_ids[i]) under the temperature-scaled distribution
  softmax(logits / T), taken BEFORE top-p filtering, so it is exactly what the trainer recomputes
  from the same token ids at the same temperature. For T == 0 (greedy) it is the T = 1 logprob.
* `token_ids` are the sampled ids, never re-tokenized text. They include the end-of-turn token when
  the model emitted one (finish_reason "stop"), and the token that completed a stop string; `text`
  excludes both (OpenAI semantics). finish_reason is "stop" (end-of-turn token or stop string),
  "length" (max_tokens or the context window) or "abort" (the reader closed the stream early).
* `score(prompt, response, T)` returns log p(response[i] | prompt, response[:i]) at temperature T
  (T == 0 means T = 1), one value per response token; `use_base=True` scores with the frozen base
  weights (the "frozen reference" teacher) whatever checkpoint is live.
* `score_top_k(prompt, response, T, top_k)` returns the same logprobs plus, per response position,
  the `top_k` most likely token ids and their logprobs at the same temperature, most likely first
  (the teacher's distribution for top-K distillation; `top_k` in 1..MAX_TOP_K).

Hot swap: `load_checkpoint` never refuses or aborts a request. Generations already running finish on
the weights they started with; generations admitted after the swap use the new ones. Each
`Generation.policy_version` is the version whose weights produced its tokens (0 = the base model).

Tenant runs (orl.schemas.ids.tenant_run): a backend holds, beside the main
policy (run ""), the newest loaded version of each tenant's own run, and answers a request for a run
with that run's weights once one of its versions is loaded, with the main policy until then.
`Generation.policy_run` names the run that answered ("" = the main policy).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from orl.rules.top_k import MAX_TOP_K
from orl.schemas.errors import OrlError

if TYPE_CHECKING:  # chat_template imports this module's PolicyError
    from orl.serving.policy.chat_template import ChatTemplate

FinishReason = Literal["stop", "length", "abort"]
CheckpointKind = Literal["full", "lora"]
MAIN_RUN = ""  # the run a server follows (--run-id); a tenant's own run is named by its run id


class PolicyError(OrlError):
    """A generation or scoring request could not be served (bad input, backend failure)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # response_format json_object / json_schema as canonical JSON (serving/policy/output_constraint.py), or None
    constraint: str | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise PolicyError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PolicyError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise PolicyError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class TokenStep:
    """One sampled token; `text` is the newly decodable text (may be "" mid multi-byte character)."""

    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True)
class Generation:
    """A finished response with the exact ids and logprobs that were sampled."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int
    latency_ms: float
    policy_run: str = MAIN_RUN  # the run whose `policy_version` produced it ("" = the main policy)


@dataclass(frozen=True)
class TopKScores:
    """A scored response: the response tokens' logprobs and, per position, the K most likely ids."""

    logprobs: list[float]  # [T]
    top_ids: list[list[int]]  # [T][K], most likely first
    top_logprobs: list[list[float]]  # [T][K], at the same temperature as `logprobs`


_StreamItem = TokenStep | Generation | BaseException


class GenerationStream:
    """An async iterator of TokenSteps; once exhausted, `generation` holds the finished response.

    Producers (a worker thread or an asyncio task) call `publish` / `publish_threadsafe` with
    TokenSteps, then exactly one Generation or exception. `aclose()` tells the producer to stop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[_StreamItem] = asyncio.Queue()
        self._generation: Generation | None = None
        self._on_close: Callable[[], object] | None = None

    def set_on_close(self, callback: Callable[[], object]) -> None:
        """Register what `aclose()` calls to stop the producer."""
        self._on_close = callback

    def publish(self, item: _StreamItem) -> None:
        """Deliver an item from the event loop's own thread."""
        self._queue.put_nowait(item)

    def publish_threadsafe(self, item: _StreamItem) -> None:
        """Deliver an item from any other thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> TokenStep:
        if self._generation is not None:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, TokenStep):
            return item
        if isinstance(item, Generation):
            self._generation = item
            raise StopAsyncIteration
        raise item

    @property
    def generation(self) -> Generation:
        """The finished response; only after the iteration ended."""
        if self._generation is None:
            raise PolicyError("the generation is not finished yet: iterate the stream to the end first")
        return self._generation

    async def result(self) -> Generation:
        """Drain the remaining steps and return the finished response."""
        async for _ in self:
            pass
        return self.generation

    async def aclose(self) -> None:
        """Stop early (client went away): the producer drops the request."""
        if self._generation is None and self._on_close is not None:
            self._on_close()


class PolicyBackend(abc.ABC):
    """A served policy: generation, scoring and hot swap of checkpoints (the port; the transformers and
    SGLang backends implement it). The name, version, context window and chat template are kept here:
    a backend sets them as it starts and swaps."""

    def __init__(self, model_name: str, context_window: int = 0) -> None:
        self._name = model_name
        self._context_window = context_window  # 0 until start() reads the model's
        self._version = 0
        self._template: ChatTemplate | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model or connect to the server; call once before anything else."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release threads, memory and connections."""

    @property
    def policy_version(self) -> int:
        """The version new requests get now (0 = the base model)."""
        return self._version

    def version_of(self, run: str) -> int | None:
        """The version of `run` that answers its requests now; None: none of its versions is loaded
        (its requests get the main policy)."""
        return self.policy_version if run == MAIN_RUN else None

    @property
    def model_name(self) -> str:
        """The name clients see in responses."""
        return self._name

    @property
    def context_window(self) -> int:
        """The maximum prompt + response length in tokens."""
        return self._context_window

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's tokenizer and chat template; only after start()."""
        if self._template is None:
            raise PolicyError(f"the {type(self).__name__} is not started")
        return self._template

    @abc.abstractmethod
    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> GenerationStream:
        """Start a generation with `run`'s policy (see the module docstring); iterate the stream for
        tokens, then read `stream.generation`."""

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> Generation:
        """Generate a whole response."""
        return await self.generate_stream(prompt_ids, params, run).result()

    @abc.abstractmethod
    async def score(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float = 1.0,
        *,
        use_base: bool = False,
    ) -> list[float]:
        """Logprobs of `response_ids` after `prompt_ids`; one per response token."""

    supports_top_k: bool = False  # whether score_top_k works (the transformers and SGLang backends)

    async def score_top_k(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float,
        top_k: int,
        *,
        use_base: bool = False,
    ) -> TopKScores:
        """`score`, plus each response position's `top_k` most likely token ids and their logprobs."""
        raise PolicyError(f"the {type(self).__name__} backend does not return top-K logprobs")

    @abc.abstractmethod
    async def load_checkpoint(
        self, path: Path, version: int, kind: CheckpointKind, run: str = MAIN_RUN
    ) -> None:
        """Hot-swap `run` to the checkpoint at `path` ("full" safetensors folder or "lora" peft adapter)."""


def check_top_k(top_k: int) -> None:
    """Refuse a top-K outside 1..MAX_TOP_K."""
    if not 1 <= top_k <= MAX_TOP_K:
        raise PolicyError(f"top_k must be between 1 and {MAX_TOP_K}, got {top_k}")


def check_prompt(prompt_ids: list[int], context_window: int) -> None:
    """Refuse empty prompts and prompts that leave no room for a single response token."""
    if not prompt_ids:
        raise PolicyError("the prompt is empty")
    if len(prompt_ids) >= context_window:
        raise PolicyError(f"the prompt has {len(prompt_ids)} tokens; the context window is {context_window}")
