"""A zero-cost policy backend for benchmarks: every request gets the same fixed tokens, instantly.

Used by benchmarks/bench_capture.py so that what is measured is the server and its capture path
(event building, Avro encoding, the spool insert, the drainer), not a model. Reads and writes no
topics or object keys.
"""

from __future__ import annotations

from pathlib import Path

from orl.serving.policy.base import (
    MAIN_RUN,
    CheckpointKind,
    Generation,
    GenerationStream,
    PolicyBackend,
    SamplingParams,
    TokenStep,
    check_prompt,
)

ECHO_TEXT = "This is a fixed benchmark reply from the echo backend."


class EchoBackend(PolicyBackend):
    """Returns `token_ids` (with fixed logprobs) for every prompt, truncated to max_tokens."""

    def __init__(
        self, token_ids: list[int] | None = None, *, text: str = ECHO_TEXT, context_window: int = 8192
    ) -> None:
        super().__init__("echo", context_window)
        self._token_ids = token_ids or list(range(1000, 1016))
        self._text = text
        self._run_versions: dict[str, int] = {}  # tenant runs "loaded" (it has no weights to swap)

    def version_of(self, run: str) -> int | None:
        return self._run_versions.get(run) if run != MAIN_RUN else self.policy_version

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams, run: str = MAIN_RUN
    ) -> GenerationStream:
        check_prompt(prompt_ids, self._context_window)
        run = run if run in self._run_versions else MAIN_RUN
        ids = self._token_ids[: params.max_tokens]
        stream = GenerationStream()
        for i, token_id in enumerate(ids):
            stream.publish(TokenStep(token_id, -0.5, self._text if i == 0 else ""))
        stream.publish(
            Generation(
                prompt_token_ids=list(prompt_ids),
                token_ids=list(ids),
                logprobs=[-0.5] * len(ids),
                text=self._text,
                finish_reason="length" if len(ids) < len(self._token_ids) else "stop",
                policy_version=self.version_of(run) or 0,
                latency_ms=0.0,
                policy_run=run,
            )
        )
        return stream

    async def score(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        temperature: float = 1.0,
        *,
        use_base: bool = False,
    ) -> list[float]:
        return [-0.5] * len(response_ids)

    async def load_checkpoint(
        self, path: Path, version: int, kind: CheckpointKind, run: str = MAIN_RUN
    ) -> None:
        if run == MAIN_RUN:
            self._version = version
        else:
            self._run_versions[run] = version
