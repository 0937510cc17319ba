"""Render OpenAI chat messages (and tools) to prompt token ids with the model's chat template.

Both backends take token ids, so the server tokenizes once, here, and records exactly those ids.
Templates that do not know tools (SmolLM2 ships plain ChatML) still get sensible prompts
(`orl.schemas.messages.plain_template_messages`: tool definitions in the system message, assistant tool
calls as `<tool_call>` JSON blocks, tool results as user turns in `<tool_response>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orl.schemas.messages import Message, UnsupportedContentError, plain_template_messages, prompt_text
from orl.serving.policy.base import PolicyError


class ChatTemplate:
    """Prompt rendering and decoding for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise PolicyError("the tokenizer has no chat template")
        self._tok = tokenizer
        self._knows_tools = "tool" in str(tokenizer.chat_template)

    @classmethod
    def from_dir(cls, model_dir: Path) -> ChatTemplate:
        """Load the tokenizer saved with a model folder."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir))

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def source(self) -> str:
        """The chat template's Jinja text."""
        return str(self._tok.chat_template)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a turn: the tokenizer's eos (SmolLM2: <|im_end|>, id 2)."""
        eos = self._tok.eos_token_id
        return frozenset([eos] if isinstance(eos, int) else list(eos or []))

    def render_text(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The prompt as text, ending with the assistant generation prompt."""
        if not messages:
            raise PolicyError("messages must not be empty")
        if self._knows_tools:
            msgs = [_plain_content(m) for m in messages]
            kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
        else:
            msgs = _plain_template_messages(messages, tools)
            kwargs = {}
        text = self._tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
        return str(text)

    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The prompt token ids (the template already holds every special token)."""
        text = self.render_text(messages, tools)
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`): exact for byte-level BPE
        vocabularies (GPT-2's byte-to-character table), where a token may hold part of a character;
        else the UTF-8 of the token decoded alone."""
        piece = self._tok.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece and all(char in _BYTE_OF_CHAR for char in piece):
            return bytes(_BYTE_OF_CHAR[char] for char in piece)
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids to text, without the tokenizer's space clean-up (exactly what was sampled)."""
        return str(
            self._tok.decode(
                list(token_ids),
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        )


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for themselves, the
    others for the characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [byte for byte in range(256) if byte not in printable]
    table = {chr(byte): byte for byte in printable}
    table.update({chr(256 + index): byte for index, byte in enumerate(others)})
    return table


_BYTE_OF_CHAR = _byte_level_table()


def _prompt_content_text(content: Any) -> str:
    """OpenAI content as the model sees it (`orl.schemas.messages.prompt_text`); a bad content is a PolicyError."""
    try:
        return prompt_text(content)
    except UnsupportedContentError as error:
        raise PolicyError(str(error)) from error


def _plain_content(message: Message) -> Message:
    return {**message, "content": _prompt_content_text(message.get("content"))}


def _plain_template_messages(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None
) -> list[Message]:
    """`orl.schemas.messages.plain_template_messages`; a bad message is a PolicyError."""
    try:
        return plain_template_messages(messages, tools)
    except UnsupportedContentError as error:
        raise PolicyError(str(error)) from error
