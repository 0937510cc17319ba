"""Policy backend that drives an SGLang server over HTTP (the GPU deployment).

Generation: SGLang's native `POST /generate` with `input_ids` (the prompt rendered by `ChatTemplate`,
so the recorded ids are exactly what the model saw) and `return_logprob`, reading sampled ids and
logprobs from `meta_info.output_token_logprobs` (`[logprob, token_id, text]`). Streaming reads SSE
`data:` chunks; `meta_info.completion_tokens` tells which entries are new, so cumulative and
incremental streams both work. Scoring: a prefill-only `/generate` (max_new_tokens 0) reading the
response suffix of `meta_info.input_token_logprobs`, and with a top-K also `top_logprobs_num` and the
suffix of `meta_info.input_top_logprobs` (replies parsed in `sglang_replies`).

Hot swap (reference/peers.md 4.1): full checkpoints via `POST /update_weights_from_disk` with
`weight_version` and `abort_all_requests=false` (a version bump never aborts running requests);
LoRA via `POST /load_lora_adapter` under a name immutable per version and unique per backend
instance (`v<version>-<instance>`, so a restarted or second orl server never collides with adapters
an earlier one left loaded), which requests pass as `lora_path`. A tenant run is a LoRA adapter of its own
(`<run>-v<version>-<instance>`), passed as `lora_path` with that tenant's requests; a full update of
the main policy changes the base every adapter was trained on, so it unloads the tenant runs' too
(their requests get the main policy until their next version). A load SGLang refuses (4xx, or
`success: false`) is a CheckpointError (PolicyRejected; the follower keeps following); an unreachable
or failing (5xx) server is a ServiceUnavailable, which the follower retries; unloads are best effort.

Temperature: SGLang's output logprobs are temperature-scaled (the contract in `base.py`) unless
SGLANG_RETURN_ORIGINAL_LOGPROB is set; its input logprobs ignore `sampling_params.temperature`, so
scoring at T != 1 sends `input_logprob_temperature` (sglang PR #36213) and refuses a reply that does
not echo it instead of passing T = 1 logprobs off as logprobs at T.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from orl.rules.sampling import effective_temperature
from orl.schemas.errors import CheckpointError, OrlError, ServiceUnavailable
from orl.serving.policy.base import (
    MAIN_RUN,
    CheckpointKind,
    Generation,
    GenerationStream,
    PolicyBackend,
    PolicyError,
    SamplingParams,
    TokenStep,
    TopKScores,
    check_prompt,
    check_top_k,
)
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.policy.detokenizer import IncrementalDecoder
from orl.serving.policy.output_constraint import json_schema_of
from orl.serving.policy.sglang_replies import (
    finish_reason,
    ids_and_logprobs,
    new_output_entries,
    response_logprobs,
    response_top_logprobs,
    served_version,
    version_number,
)

log = logging.getLogger(__name__)

_LORAS_KEPT = 3  # adapters of the newest versions stay loaded for requests still running on them


class SGLangBackend(PolicyBackend):
    """A policy served by an SGLang server at `base_url`."""

    def __init__(
        self,
        base_url: str,
        *,
        model_name: str,
        tokenizer_dir: Path,
        api_key: str | None = None,
        reference_url: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 3.0,
        context_window: int | None = None,
    ) -> None:
        super().__init__(model_name, context_window or 0)
        self._url = base_url.rstrip("/")
        self._ref_url = reference_url.rstrip("/") if reference_url else None
        self._tokenizer_dir = Path(tokenizer_dir)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._client: httpx.AsyncClient | None = None
        self._full_loaded = False
        self._instance = secrets.token_hex(3)  # adapter names of this backend never collide with others'
        # by run: its loaded adapters' names, oldest first; the last one serves
        self._loras: dict[str, list[str]] = {MAIN_RUN: []}
        self._run_versions: dict[str, int] = {}  # tenant runs with an adapter loaded: the version it is
        self._lora_paths: dict[str, str] = {}
        self._swap_lock = asyncio.Lock()

    async def start(self) -> None:
        self._template = await asyncio.to_thread(ChatTemplate.from_dir, self._tokenizer_dir)
        if not self._context_window:
            self._context_window = _context_window_of(self._tokenizer_dir)
        self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        body = await self._request("GET", "/get_weight_version")
        self._version = version_number(body.get("weight_version"), default=0)
        log.info("SGLang backend %s at %s, weight version %d", self._name, self._url, self._version)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- generation --------------------------------------------------------------------------

    def version_of(self, run: str) -> int | None:
        return self._version if run == MAIN_RUN else self._run_versions.get(run)

    def _answering(self, run: str) -> tuple[str, int]:
        """The run that answers a request for `run` (the main policy until one of its versions is
        loaded) and the version it is at."""
        version = self.version_of(run)
        return (run, version) if version is not None else (MAIN_RUN, self._version)

    def _generate_body(
        self, prompt_ids: list[int], params: SamplingParams, stream: bool, run: str
    ) -> dict[str, Any]:
        check_prompt(prompt_ids, self._context_window)
        sampling: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_new_tokens": min(params.max_tokens, self._context_window - len(prompt_ids)),
            "stop": list(params.stop),
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        if params.constraint is not None:  # SGLang enforces it with its grammar backend
            sampling["json_schema"] = json.dumps(json_schema_of(params.constraint))
        body: dict[str, Any] = {
            "input_ids": list(prompt_ids),
            "sampling_params": sampling,
            "return_logprob": True,
            "stream": stream,
        }
        if self._loras[run]:
            body["lora_path"] = self._loras[run][-1]
        return body

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> Generation:
        run, version = self._answering(run)
        body = self._generate_body(prompt_ids, params, stream=False, run=run)
        started = asyncio.get_running_loop().time()
        out = await self._request("POST", "/generate", body)
        meta = out.get("meta_info") or {}
        ids, logprobs = ids_and_logprobs(meta.get("output_token_logprobs"), "output_token_logprobs")
        return Generation(
            prompt_token_ids=list(prompt_ids),
            token_ids=ids,
            logprobs=logprobs,
            text=str(out.get("text", "")),
            finish_reason=finish_reason(meta.get("finish_reason")),
            policy_version=served_version(body, meta, version),
            latency_ms=(asyncio.get_running_loop().time() - started) * 1000.0,
            policy_run=run,
        )

    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> GenerationStream:
        # The version is read with the body (same adapter), not when the task runs: a swap may land between.
        run, version = self._answering(run)
        body = self._generate_body(prompt_ids, params, stream=True, run=run)
        stream = GenerationStream()
        task = asyncio.get_running_loop().create_task(self._pump(body, run, version, params, stream))
        stream.set_on_close(task.cancel)
        return stream

    async def _pump(
        self, body: dict[str, Any], run: str, version: int, params: SamplingParams, stream: GenerationStream
    ) -> None:
        """Read SSE chunks and publish TokenSteps, then the Generation (or the error)."""
        started = asyncio.get_running_loop().time()
        decoder = IncrementalDecoder(self.chat_template.decode, params.stop, self.chat_template.eos_token_ids)
        ids: list[int] = []
        logprobs: list[float] = []
        meta: dict[str, Any] = {}
        try:
            async for chunk in self._sse("/generate", body):
                meta = chunk.get("meta_info") or {}
                fresh = new_output_entries(meta, len(ids))
                for i, (token, logprob) in enumerate(fresh):
                    ids.append(token)
                    logprobs.append(logprob)
                    delta = decoder.add(token)
                    if i == len(fresh) - 1 and meta.get("finish_reason") is not None:
                        delta += decoder.finish()  # the last token carries any held-back text
                    stream.publish(TokenStep(token, logprob, delta))
        except Exception as exc:  # delivered to the stream's reader, who raises it
            stream.publish(exc)
            return
        stream.publish(
            Generation(
                prompt_token_ids=list(body["input_ids"]),
                token_ids=ids,
                logprobs=logprobs,
                text=decoder.text,
                finish_reason=finish_reason(meta.get("finish_reason")),
                policy_version=served_version(body, meta, version),
                latency_ms=(asyncio.get_running_loop().time() - started) * 1000.0,
                policy_run=run,
            )
        )

    # -- scoring -----------------------------------------------------------------------------

    async def score(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float = 1.0,
        *,
        use_base: bool = False,
    ) -> list[float]:
        check_prompt(prompt_ids, self._context_window)
        if not response_ids:
            return []
        meta = await self._prefill(prompt_ids, response_ids, temperature, use_base, {})
        return response_logprobs(meta.get("input_token_logprobs"), response_ids)

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
        check_prompt(prompt_ids, self._context_window)
        check_top_k(top_k)
        if not response_ids:
            return TopKScores([], [], [])
        meta = await self._prefill(
            prompt_ids, response_ids, temperature, use_base, {"top_logprobs_num": top_k}
        )
        logprobs = response_logprobs(meta.get("input_token_logprobs"), response_ids)
        top_ids, top_logprobs = response_top_logprobs(
            meta.get("input_top_logprobs"), len(response_ids), top_k
        )
        return TopKScores(logprobs, top_ids, top_logprobs)

    async def _prefill(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float,
        use_base: bool,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        """A prefill-only /generate over prompt + response with input logprobs from the last prompt token on."""
        url = self._url
        temperature = effective_temperature(temperature)
        body: dict[str, Any] = {
            "input_ids": list(prompt_ids) + list(response_ids),
            "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
            "return_logprob": True,
            "logprob_start_len": len(prompt_ids) - 1,
            **extra,
        }
        if temperature != 1.0:  # SGLang's input logprobs ignore sampling_params.temperature
            body["input_logprob_temperature"] = temperature
        if use_base and self._full_loaded:
            if self._ref_url is None:
                raise PolicyError(
                    "scoring with the base weights after a full-weight update needs reference_url"
                )
            url = self._ref_url
        elif not use_base and self._loras[MAIN_RUN]:
            body["lora_path"] = self._loras[MAIN_RUN][-1]
        out = await self._request("POST", "/generate", body, base_url=url)
        meta: dict[str, Any] = out.get("meta_info") or {}
        if temperature != 1.0 and meta.get("input_logprob_temperature") != temperature:
            raise PolicyError(
                f"SGLang at {url} returned input logprobs without applying temperature {temperature} "
                "(it needs input_logprob_temperature support, sglang PR #36213); score at temperature 1 "
                "or use a server that has it"
            )
        return meta

    # -- hot swap ----------------------------------------------------------------------------

    async def load_checkpoint(
        self, path: Path, version: int, kind: CheckpointKind, run: str = MAIN_RUN
    ) -> None:
        async with self._swap_lock:
            if kind == "full" and run != MAIN_RUN:
                raise CheckpointError(
                    f"tenant run {run!r} v{version} is a full checkpoint: on SGLang a tenant run is a LoRA "
                    "adapter over the served base (train it with --lora-rank > 0)"
                )
            if kind == "full":
                await self._load_full(Path(path), version)
            elif kind == "lora":
                await self._load_lora(Path(path), version, run)
            else:
                raise CheckpointError(f"unknown checkpoint kind {kind!r} (expected 'full' or 'lora')")
            log.info(
                "SGLang at %s now serves %sv%d (%s)", self._url, f"run {run} " if run else "", version, kind
            )
            await self._unload_old_adapters(run)

    async def _load_full(self, path: Path, version: int) -> None:
        body = {"model_path": str(path), "weight_version": str(version), "abort_all_requests": False}
        out = await self._request("POST", "/update_weights_from_disk", body, checkpoint=True)
        if not out.get("success", False):
            raise CheckpointError(f"SGLang refused {path}: {out.get('message')}")
        # No await from here to the version: a request admitted now must carry the new version.
        self._full_loaded = True
        self._version = version
        self._loras, stale = {MAIN_RUN: []}, self._loras  # adapters were trained on the old base
        self._run_versions = {}
        for name in (name for names in stale.values() for name in names):
            await self._unload_adapter(name)

    async def _load_lora(self, path: Path, version: int, run: str) -> None:
        name = f"{run}-v{version}-{self._instance}" if run else f"v{version}-{self._instance}"
        loaded = self._loras.setdefault(run, [])
        if name in self._lora_paths and self._lora_paths[name] != str(path):
            raise CheckpointError(
                f"LoRA adapter {name} was loaded from {self._lora_paths[name]}; names are immutable"
            )
        if name in loaded:  # serving it again (a rollback): reload, SGLang may have evicted it
            loaded.remove(name)
            await self._unload_adapter(name)
        out = await self._request(
            "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, checkpoint=True
        )
        if not out.get("success", True):
            raise CheckpointError(f"SGLang refused the adapter {path}: {out.get('error_message')}")
        # No await from here to the version: a request that picks this adapter carries its version.
        self._lora_paths[name] = str(path)
        loaded.append(name)
        if run == MAIN_RUN:
            self._version = version
        else:
            self._run_versions[run] = version

    async def _unload_old_adapters(self, run: str) -> None:
        """Keep a run's newest adapters for requests still running on them; SGLang waits for those anyway."""
        loaded = self._loras.get(run, [])
        while len(loaded) > _LORAS_KEPT:
            await self._unload_adapter(loaded.pop(0))

    async def _unload_adapter(self, name: str) -> None:
        """Best effort: an adapter SGLang already dropped (eviction, restart) is not an error."""
        try:
            await self._request("POST", "/unload_lora_adapter", {"lora_name": name})
        except OrlError as error:
            log.warning("could not unload LoRA adapter %s from %s: %s", name, self._url, error)

    # -- HTTP --------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise PolicyError("the SGLang backend is not started (call start() first)")
        return self._client

    async def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        base_url: str | None = None,
        checkpoint: bool = False,
    ) -> dict[str, Any]:
        url = (base_url or self._url) + path
        try:
            response = await self._http().request(method, url, json=body)
        except (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError) as exc:
            # not a verdict on a checkpoint being swapped in either: the follower retries the swap
            raise ServiceUnavailable(f"SGLang server at {url} is unreachable: {exc!r}") from exc
        _raise_for_status(response, url, checkpoint)
        data = response.json()
        return data if isinstance(data, dict) else {"value": data}

    async def _sse(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        url = self._url + path
        try:
            async with self._http().stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response, url, checkpoint=False)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if isinstance(chunk, dict) and "error" in chunk:  # SGLang reports it inside the stream
                        raise PolicyError(f"SGLang {url} failed the request: {chunk['error']}")
                    yield chunk
        except (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError) as exc:
            raise ServiceUnavailable(f"SGLang server at {url} is unreachable: {exc!r}") from exc


def _raise_for_status(response: httpx.Response, url: str, checkpoint: bool) -> None:
    if response.status_code < 400:
        return
    """5xx: SGLang is failing or restarting (retried, a swap too); 4xx: a refusal (of a checkpoint: for good)."""
    message = f"SGLang {url} answered {response.status_code}: {response.text[:500]}"
    if response.status_code >= 500:
        raise ServiceUnavailable(message)
    raise CheckpointError(message) if checkpoint else PolicyError(message)


def _context_window_of(model_dir: Path) -> int:
    config = model_dir / "config.json"
    if config.is_file():
        window = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(window, int):
            return window
    return 8192
