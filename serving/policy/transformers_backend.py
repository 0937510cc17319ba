"""In-process policy backend on Hugging Face transformers (CPU): batched generation, scoring, hot swap.

One worker thread owns the model. Between decode steps it admits waiting requests into the running
batch (up to `max_batch_size` rows), runs scoring jobs, and applies a pending checkpoint swap once
the rows running on the old weights have drained; requests that arrive meanwhile wait (nothing is
refused). Tokens reach each request's asyncio stream through `call_soon_threadsafe`.

Weights: an fp32 master copy, run under bf16 autocast where the hardware runs bf16 natively and in
fp32 elsewhere (`orl.compute.machine.choose_numerics`; the caller passes the dtype). Under bf16 autocast
the served copy's transformer-body Linear weights are cast to bf16 once, when it is built: autocast would
cast them to the same values at every call, so a decode step skips the casts and its logits agree to
about 1e-5 (bit-identical on some CPUs; `benchmarks/bench_decode_weights.py`). The fp32 master stays for LoRA merges and full loads. Threads: the
worker sets its torch threads before every step from the core board (`orl.compute.machine.CoreBoard`),
so the server shares the cores fairly with a trainer computing on the same machine. The base weights stay loaded, frozen, for
`score(use_base=True)`; a "full" checkpoint is a folder with `model.safetensors`, a "lora"
checkpoint is a peft adapter folder merged into a copy of the base. Both are built off the hot path
(in a thread) and swapped in at a batch boundary. Reads checkpoint folders; writes nothing.

Tenant runs: beside the main policy, the backend holds the newest loaded
version of each tenant's own run (a merged copy of the base each, about 330 MB for SmolLM2-135M under
bf16), each with its own running batch and prefix cache; a decode step advances every policy's batch
in turn. A request for a run none of whose versions is loaded yet is answered by the main policy.

Prefix cache (`orl.serving.policy.prefix_cache.PrefixCache`, one per served policy): prompts' KV is kept, up to `prefix_cache_bytes`, so a
client that resends its conversation prefills only the new tokens; a swap empties it. SmolLM2-135M
keeps 45 KiB per token (30 layers x keys and values x 3 heads x 64 x fp32, under bf16 autocast too),
so 1 GiB holds about 23k tokens: two or three 8k-token agent prompts.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from orl.compute.machine import CoreBoard, available_cores
from orl.connectors.model_files import checkpoint_model
from orl.rules.sampling import effective_temperature
from orl.schemas.errors import ConfigError
from orl.serving.policy.base import (
    MAIN_RUN,
    CheckpointKind,
    GenerationStream,
    PolicyBackend,
    PolicyError,
    SamplingParams,
    TopKScores,
    check_prompt,
    check_top_k,
)
from orl.serving.policy.batch_engine import ActiveBatch, Row, hidden_states, lm_logits
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.policy.detokenizer import IncrementalDecoder
from orl.serving.policy.output_constraint import ConstraintCompiler, ConstraintError, OutputConstraint

log = logging.getLogger(__name__)

_Job = Callable[[], Any]
IDLE_AFTER_S = 0.5  # no work for this long: the worker marks itself idle on the core board
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
_Swap = tuple[Any, int, concurrent.futures.Future[None]]  # (model, version, done)


@dataclass(eq=False)
class _ServedPolicy:
    """One run as served: its weights and version, the rows decoding on them, the requests waiting
    for a place, and a swap waiting for the running rows to drain. Guarded by the backend's lock."""

    run: str
    model: Any
    version: int
    batch: ActiveBatch
    pending: collections.deque[Row] = field(default_factory=collections.deque)
    swap: _Swap | None = None

    def has_work(self) -> bool:
        return bool(self.pending or self.batch.rows or self.swap)


class TransformersBackend(PolicyBackend):
    """Serve a local Hugging Face model folder with continuous batching on CPU."""

    def __init__(
        self,
        model_dir: Path,
        *,
        model_name: str | None = None,
        device: str = "cpu",
        autocast_dtype: torch.dtype | None = None,
        max_batch_size: int = 16,
        num_threads: int | None = None,
        core_board: CoreBoard | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        if device != "cpu":
            raise ConfigError(
                f"device {device!r}: the transformers backend serves on cpu (use SGLang on GPUs)"
            )
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_bytes < 0:
            raise ConfigError(f"prefix_cache_bytes must be >= 0, got {prefix_cache_bytes}")
        super().__init__(model_name or Path(model_dir).name)
        self._prefix_cache_bytes = prefix_cache_bytes
        self._model_dir = Path(model_dir)
        self._autocast_dtype = autocast_dtype
        self._max_batch = max_batch_size
        self._board = core_board or CoreBoard(None, num_threads or available_cores())
        self._cv = threading.Condition()
        self._jobs: collections.deque[tuple[_Job, concurrent.futures.Future[Any]]] = collections.deque()
        self._policies: dict[str, _ServedPolicy] = {}  # by run; MAIN_RUN from start()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._swap_lock = asyncio.Lock()
        self._base: Any = None  # fp32 master: LoRA adapters merge into copies of it
        self._served_base: Any = None  # the base as served (`_for_decoding`), for score(use_base=True)
        self._pad_id = 0
        self._eos_ids: frozenset[int] = frozenset()
        self._constraints: ConstraintCompiler | None = None  # built on the first constrained request
        self.batch_size_counts: collections.Counter[int] = collections.Counter()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        torch.set_num_threads(self._board.cores)
        await asyncio.to_thread(self._load_base)
        self._thread = threading.Thread(target=self._worker, name="orl-policy-worker", daemon=True)
        self._thread.start()
        log.info(
            "transformers backend serving %s from %s (%s, %d threads alone, a fair share while others compute; "
            "prefix cache %d MiB)",
            self._name,
            self._model_dir,
            "bf16 autocast" if self._autocast_dtype is not None else "fp32",
            self._board.cores,
            self._prefix_cache_bytes >> 20,
        )

    async def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _load_base(self) -> None:
        from transformers import AutoModelForCausalLM

        if not (self._model_dir / "config.json").is_file():
            raise ConfigError(f"{self._model_dir} is not a Hugging Face model folder (no config.json)")
        self._template = ChatTemplate.from_dir(self._model_dir)
        base = AutoModelForCausalLM.from_pretrained(self._model_dir, dtype=torch.float32)
        base.eval().requires_grad_(False)
        self._base = base
        self._served_base = self._for_decoding(copy.deepcopy(base))
        self._context_window = int(base.config.max_position_embeddings)
        self._eos_ids = self._template.eos_token_ids | _config_eos_ids(base)
        pad = self._template.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else min(self._eos_ids)
        self._policies[MAIN_RUN] = self._served_policy(MAIN_RUN, self._served_base, 0)

    def _served_policy(self, run: str, model: Any, version: int) -> _ServedPolicy:
        batch = ActiveBatch(self._autocast_dtype, self._pad_id, self._prefix_cache_bytes)
        return _ServedPolicy(run, model, version, batch)

    # -- properties --------------------------------------------------------------------------

    def version_of(self, run: str) -> int | None:
        with self._cv:
            policy = self._policies.get(run)
            return None if policy is None else policy.version

    def _batches(self) -> list[ActiveBatch]:
        with self._cv:
            return [policy.batch for policy in self._policies.values()]

    @property
    def prefill_token_counts(self) -> dict[str, int]:
        """Prompt tokens prefilled so far: "computed" by the model and "reused" from the prefix cache."""
        batches = self._batches()
        return {
            kind: sum(batch.prefill_tokens.get(kind, 0) for batch in batches)
            for kind in ("computed", "reused")
        }

    @property
    def prefix_cache_size(self) -> tuple[int, int]:
        """(prompts, bytes) kept in the prefix caches now."""
        batches = self._batches()
        return sum(len(b.prefixes) for b in batches), sum(b.prefixes.nbytes for b in batches)

    @property
    def max_batch_size_seen(self) -> int:
        """The largest number of rows decoded together so far (1 = never batched)."""
        return max(self.batch_size_counts, default=0)

    # -- requests ----------------------------------------------------------------------------

    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> GenerationStream:
        self._require_running()
        check_prompt(prompt_ids, self._context_window)
        stream = GenerationStream()
        decoder = IncrementalDecoder(self.chat_template.decode, params.stop, self._eos_ids)
        max_new = min(params.max_tokens, self._context_window - len(prompt_ids))
        row = Row(list(prompt_ids), params, max_new, stream, decoder, constraint=self._constraint(params))
        stream.set_on_close(row.cancelled.set)
        with self._cv:
            policy = self._policies.get(run) or self._policies[MAIN_RUN]  # none of run's versions yet
            row.run = policy.run
            policy.pending.append(row)
            self._cv.notify()
        return stream

    def _constraint(self, params: SamplingParams) -> OutputConstraint | None:
        if params.constraint is None:
            return None
        if self._constraints is None:
            self._constraints = ConstraintCompiler(self.chat_template, self._eos_ids)
        try:
            return self._constraints.constraint(params.constraint)
        except ConstraintError as error:
            raise PolicyError(str(error)) from error

    async def score(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float = 1.0,
        *,
        use_base: bool = False,
    ) -> list[float]:
        self._check_score_input(prompt_ids, response_ids)
        if not response_ids:
            return []
        temp = effective_temperature(temperature)

        def job() -> list[float]:
            logp_T_V = self._response_logprobs_now(use_base, prompt_ids, response_ids, temp)
            picked = logp_T_V.gather(1, torch.tensor(response_ids, dtype=torch.long)[:, None])[:, 0]
            return [float(x) for x in picked]

        result: list[float] = await self._run_job(job)
        return result

    supports_top_k = True

    async def score_top_k(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float,
        top_k: int,
        *,
        use_base: bool = False,
    ) -> TopKScores:
        self._check_score_input(prompt_ids, response_ids)
        check_top_k(top_k)
        temp = effective_temperature(temperature)

        def job() -> TopKScores:
            if not response_ids:
                return TopKScores([], [], [])
            logp_T_V = self._response_logprobs_now(use_base, prompt_ids, response_ids, temp)
            picked = logp_T_V.gather(1, torch.tensor(response_ids, dtype=torch.long)[:, None])[:, 0]
            top_T_K = logp_T_V.topk(min(top_k, logp_T_V.shape[-1]), dim=-1)
            return TopKScores(picked.tolist(), top_T_K.indices.tolist(), top_T_K.values.tolist())

        result: TopKScores = await self._run_job(job)
        return result

    def _check_score_input(self, prompt_ids: list[int], response_ids: list[int]) -> None:
        self._require_running()
        check_prompt(prompt_ids, self._context_window)
        if len(prompt_ids) + len(response_ids) > self._context_window:
            raise PolicyError(f"prompt + response exceed the context window of {self._context_window}")

    def _response_logprobs_now(
        self, use_base: bool, prompt: list[int], response: list[int], temp: float
    ) -> torch.Tensor:
        """log softmax(logits / temp) at the positions that predict each response token: [T, V] fp32."""
        model = self._served_base if use_base else self._policies[MAIN_RUN].model
        ids = torch.tensor([prompt + response], dtype=torch.long)
        hidden = hidden_states(model, self._autocast_dtype, input_ids=ids, use_cache=False)
        h = hidden[0, len(prompt) - 1 : len(prompt) + len(response) - 1]
        return torch.log_softmax(lm_logits(model, h) / temp, dim=-1)

    async def _run_job(self, job: _Job) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cv:
            self._jobs.append((job, future))
            self._cv.notify()
        return await asyncio.wrap_future(future)

    def _require_running(self) -> None:
        if self._thread is None or self._closing:
            raise PolicyError("the transformers backend is not running (call start() first)")

    # -- hot swap ----------------------------------------------------------------------------

    async def load_checkpoint(
        self, path: Path, version: int, kind: CheckpointKind, run: str = MAIN_RUN
    ) -> None:
        self._require_running()
        async with self._swap_lock:
            named = f"run {run} " if run != MAIN_RUN else ""
            log.info("loading %s%s checkpoint v%d from %s", named, kind, version, path)
            model = await asyncio.to_thread(self._build_model, Path(path), kind)
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            with self._cv:
                policy = self._policies.get(run)
                if policy is None:  # a tenant run's first version: nothing runs on it to drain
                    self._policies[run] = self._served_policy(run, model, version)
                    future.set_result(None)
                else:
                    policy.swap = (model, version, future)
                self._cv.notify()
            await asyncio.wrap_future(future)
            log.info("%spolicy v%d active", named, version)

    def _build_model(self, path: Path, kind: CheckpointKind) -> Any:
        return self._for_decoding(checkpoint_model(copy.deepcopy(self._base), path, kind))

    def _for_decoding(self, model: Any) -> Any:
        """`model` as served, changed in place: under bf16 autocast, the transformer body's Linear weights
        in bf16 (norms, embeddings and the fp32 head keep fp32); without autocast, as it is."""
        if self._autocast_dtype is not None:
            for module in model.model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.data = module.weight.data.to(self._autocast_dtype)
        return model

    # -- worker thread -----------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            with self._cv:
                # Idle on the board only after a pause longer than the gaps between a client's
                # requests, so a trainer does not grab every core between two decode waves.
                if not self._has_work() and not self._cv.wait_for(
                    lambda: self._closing or self._has_work(), IDLE_AFTER_S
                ):
                    self._board.idle()
                while not (self._closing or self._has_work()):
                    self._cv.wait()
                if self._closing:
                    break
                jobs = list(self._jobs)
                self._jobs.clear()
                policies = list(self._policies.values())
                admits = [self._take_pending(policy) for policy in policies]
            self._board.busy()
            self._board.fit_threads()
            self._run_jobs(jobs)
            for policy, admit in zip(policies, admits, strict=True):
                self._advance(policy, admit)
        self._board.idle()
        self._fail_everything()

    def _has_work(self) -> bool:
        return bool(self._jobs) or any(policy.has_work() for policy in self._policies.values())

    def _take_pending(self, policy: _ServedPolicy) -> list[Row]:
        """Rows of `policy` to admit now (the lock held): none while a swap waits for its running rows
        to drain, and the swap itself once they have."""
        if policy.swap is not None:
            if policy.batch.rows:
                return []
            self._apply_swap(policy)
        rows: list[Row] = []
        while policy.pending and len(rows) < self._max_batch - len(policy.batch.rows):
            row = policy.pending.popleft()
            if not row.cancelled.is_set():
                rows.append(row)
        return rows

    def _apply_swap(self, policy: _ServedPolicy) -> None:
        assert policy.swap is not None
        model, version, future = policy.swap
        policy.model, policy.version, policy.swap = model, version, None
        if policy.run == MAIN_RUN:
            self._version = version
        policy.batch.prefixes.clear()  # the old weights' KV; free it now, not at the next admission
        future.set_result(None)

    def _advance(self, policy: _ServedPolicy, admit: list[Row]) -> None:
        batch = policy.batch
        try:
            with torch.inference_mode():
                if admit:
                    batch.admit(admit, policy.model, policy.version)
                if batch.rows:
                    self.batch_size_counts[len(batch.rows)] += 1
                    batch.step()
        except Exception as exc:  # a failed step must not hang every waiting client
            log.exception("generation step failed; failing %d rows", len(batch.rows) + len(admit))
            error = PolicyError(f"generation failed: {exc}")
            for row in admit:
                if row.finish_reason is None and row not in batch.rows:
                    row.stream.publish_threadsafe(error)
            batch.fail_all(error)

    def _run_jobs(self, jobs: list[tuple[_Job, concurrent.futures.Future[Any]]]) -> None:
        for job, future in jobs:
            try:
                with torch.inference_mode():
                    future.set_result(job())
            except Exception as exc:  # delivered to the awaiting caller, not swallowed
                future.set_exception(exc)

    def _fail_everything(self) -> None:
        error = PolicyError("the transformers backend was closed")
        with self._cv:
            for policy in self._policies.values():
                policy.batch.fail_all(error)
                for row in policy.pending:
                    row.stream.publish_threadsafe(error)
                policy.pending.clear()
                if policy.swap is not None:
                    policy.swap[2].set_exception(error)
                    policy.swap = None
            for _, future in self._jobs:
                future.set_exception(error)
            self._jobs.clear()


def _config_eos_ids(model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for cfg in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    return frozenset(ids)
