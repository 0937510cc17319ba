"""Token ids and old logprobs for imported text-only turns (OpenClaw-RL records carry no sampled ids).

The prompt is the record's messages rendered with the target model's chat template (generation
prompt added) as serving renders them (`orl.schemas.messages`: a template without tool roles gets tool
calls and results in the Hermes form), or, for records without messages, its `prompt_text`
tokenized as is; the response is its text with its tool calls as `<tool_call>` blocks (the form a
model prompted that way generates) and the end of turn token when it finished normally. Old logprobs are either recomputed with the base model at
the import temperature ("base") or left as 0.0 placeholders ("placeholder"); either way the
responses are marked off-policy, and the trainer's default old-logprob mode (recompute) never reads
them. Reads and writes no topics.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal, Protocol

from orl.schemas import messages as chat_messages
from orl.schemas.errors import ConfigError

LogprobMode = Literal["base", "placeholder"]
LOGPROB_MODES: tuple[str, ...] = typing.get_args(LogprobMode)


class ImportTokenizer(Protocol):
    def prompt_ids(self, messages: list[dict[str, Any]] | None, prompt_text: str) -> list[int]: ...

    def response_ids(self, text: str, tool_calls: list[Any] | None, finished: bool) -> list[int]: ...


class LogprobScorer(Protocol):
    def logprobs(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]: ...


class HFImportTokenizer:
    """The model's own tokenizer and chat template (transformers)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        self._knows_tools = "tool" in str(self._tok.chat_template)

    def prompt_ids(self, messages: list[dict[str, Any]] | None, prompt_text: str) -> list[int]:
        if messages:
            if self._knows_tools:
                plain = [{**m, "content": chat_messages.prompt_text(m.get("content"))} for m in messages]
            else:
                plain = chat_messages.plain_template_messages([{"role": "user", **m} for m in messages])
            # As serving renders a prompt: the template's text, then its tokens (no extra special tokens).
            text = self._tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
            return [int(i) for i in self._tok(str(text), add_special_tokens=False)["input_ids"]]
        return [int(i) for i in self._tok.encode(prompt_text, add_special_tokens=False)]

    def response_ids(self, text: str, tool_calls: list[Any] | None, finished: bool) -> list[int]:
        ids = [
            int(i)
            for i in self._tok.encode(
                chat_messages.assistant_text_with_tool_calls(text, tool_calls), add_special_tokens=False
            )
        ]
        eos = self._tok.eos_token_id
        return ids + [int(eos)] if finished and isinstance(eos, int) else ids


class BaseModelScorer:
    """log pi_base(response token | prompt, previous tokens) at a temperature, on CPU or GPU (torch)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self._model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
        self._model.eval()

    def logprobs(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
        if not response_ids:
            return []
        torch = self._torch
        ids = torch.tensor([prompt_ids + response_ids])
        with torch.no_grad():
            logits_T_V = self._model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logprobs_T_V = torch.log_softmax(logits_T_V / max(temperature, 1e-6), dim=-1)
        picked_T = logprobs_T_V.gather(1, torch.tensor(response_ids).unsqueeze(1)).squeeze(1)
        return [float(x) for x in picked_T]


class PlaceholderScorer:
    """0.0 per token: only for off-policy imports trained with old_logprobs=recompute."""

    def logprobs(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
        return [0.0] * len(response_ids)


def scorer_for(mode: str, model_dir: Path | None) -> LogprobScorer:
    if mode == "placeholder":
        return PlaceholderScorer()
    if mode == "base":
        if model_dir is None:
            raise ConfigError("--import-logprobs base needs the base model (--model)")
        return BaseModelScorer(model_dir)
    raise ConfigError(f"--import-logprobs must be one of {', '.join(LOGPROB_MODES)}, not {mode!r}")
