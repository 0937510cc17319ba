"""The bytes of each token (OpenAI's logprobs `bytes`) on the real SmolLM2 tokenizer: a token may hold
part of a character, and the tokens' bytes in order are the text's UTF-8, exactly."""

from __future__ import annotations

from orl.serving.policy.chat_template import ChatTemplate

from tests.component.test_capture_chat import template  # noqa: F401 - a fixture


def test_the_tokens_bytes_add_up_to_the_texts_utf8(template: ChatTemplate) -> None:  # noqa: F811
    text = "Café 🙂 naïve — 東京 <|im_end|>"
    ids = template.render_text([{"role": "user", "content": text}])
    token_ids = list(template.tokenizer(ids, add_special_tokens=False)["input_ids"])
    joined = b"".join(template.token_bytes(token_id) for token_id in token_ids)
    assert joined == ids.encode("utf-8")
    split_characters = [t for t in token_ids if not _whole_utf8(template.token_bytes(t))]
    assert split_characters, "the emoji and the CJK take more than one token each: some hold part of one"


def _whole_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
