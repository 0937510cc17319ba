"""The shared message rules (schemas/messages.py): content text, prompt text, tool calls, identity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from orl.schemas.errors import OrlError
from orl.schemas.messages import (
    UnsupportedContentError,
    content_text,
    conversation_key,
    message_key,
    message_text,
    messages_digest,
    parsed_arguments,
    prompt_text,
    tool_calls_text,
)

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
LS_CALL = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
# A conversation with every shape: string, parts with an image, None content with a tool call, a tool result.
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "héllo"}, IMAGE]},
    {"role": "assistant", "content": None, "tool_calls": [LS_CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
]


def test_string_content_is_kept_as_is() -> None:
    assert content_text("  two\nlines ") == "  two\nlines "
    assert prompt_text("  two\nlines ") == "  two\nlines "


def test_none_content_is_empty() -> None:
    assert content_text(None) == ""
    assert prompt_text(None) == ""


def test_text_parts_read_one_per_line_but_prompt_run_together() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, {"type": "text", "text": "b"}]
    assert content_text(parts) == "a\nb"  # the empty part adds no blank line
    assert prompt_text(parts) == "ab"


def test_a_text_part_is_a_string_a_text_type_or_a_text_key() -> None:
    parts = ["plain", {"type": "input_text", "text": "keyed"}, {"type": "text"}]
    assert prompt_text(parts) == "plainkeyed"
    assert content_text(parts) == "plain\nkeyed"


def test_non_text_parts_show_as_placeholders_and_are_left_out_of_prompts() -> None:
    parts = [{"type": "text", "text": "look:"}, IMAGE, {"no_type": 1}]
    assert content_text(parts) == "look:\n[image_url]\n[part]"
    assert prompt_text(parts) == "look:"


def test_other_content_is_json_when_read_and_an_error_when_prompted() -> None:
    assert content_text({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    with pytest.raises(UnsupportedContentError, match="of type dict") as caught:
        prompt_text({"b": 1})
    assert isinstance(caught.value, OrlError)


def test_tool_calls_read_one_line_each_with_arguments_as_sent() -> None:
    calls = [LS_CALL, {"function": {"name": "pwd"}}, {"name": "flat"}]
    assert tool_calls_text(calls) == '[tool call] ls({"path": "."})\n[tool call] pwd()\n[tool call] ?()'
    assert tool_calls_text(None) == "" and tool_calls_text([]) == ""


def test_message_text_is_content_then_tool_calls() -> None:
    assistant = {"role": "assistant", "content": "Listing.", "tool_calls": [LS_CALL]}
    assert message_text(assistant) == 'Listing.\n[tool call] ls({"path": "."})'
    assert message_text(CONVERSATION[2]) == '[tool call] ls({"path": "."})'


def test_tool_messages_read_their_content() -> None:
    assert message_text(CONVERSATION[3]) == "a.txt"
    assert message_key(CONVERSATION[3]) == {
        "role": "tool",
        "content": "a.txt",
        "tool_calls": [],
        "tool_call_id": "c1",
    }


def test_arguments_parse_as_json_or_stay_raw() -> None:
    assert parsed_arguments('{"b": 2, "a": 1}') == {"a": 1, "b": 2}
    assert parsed_arguments("not json") == "not json"
    assert parsed_arguments({"a": 1}) == {"a": 1}


def test_message_key_ignores_what_clients_change_when_echoing_a_reply() -> None:
    reply = {"role": "assistant", "content": " Done. ", "tool_calls": [LS_CALL]}
    echoed = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Done."}],
        "tool_calls": [{"function": {"name": "ls", "arguments": '{"path":"."}'}}],
    }
    assert message_key(reply) == message_key(echoed)
    assert conversation_key([reply]) == conversation_key([echoed])
    assert conversation_key([reply]) != conversation_key([{**echoed, "content": "Done!"}])


def test_the_digest_is_strict_where_the_key_is_lenient() -> None:
    # The digest compares a client's request with its own next one, so whitespace counts.
    assert messages_digest([{"role": "user", "content": "hi"}]) != messages_digest(
        [{"role": "user", "content": " hi"}]
    )
    assert messages_digest([{"role": "user", "content": "hi"}]) == messages_digest(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    )


def test_digest_and_key_bytes_are_those_of_earlier_releases() -> None:
    # Pinned: the turn linker keeps digests in changelog-backed state, so a new rule would unlink
    # every open session at deploy. Values computed with the code before the rules moved here.
    assert messages_digest(CONVERSATION) == "9f0ae28e4fc38de1f675de3fb98a84b98ad915849eee772c4a6e637be83238bd"
    assert (
        conversation_key(CONVERSATION) == "75115bafdda51d3302db35a00faa85b56ed46751fadeb7f5c5555473014c3973"
    )


@given(st.lists(st.text(max_size=8), max_size=4))
def test_a_string_and_its_text_parts_match(texts: list[str]) -> None:
    parts = [{"type": "text", "text": t} for t in texts]
    assert prompt_text(parts) == "".join(texts)
    joined = {"role": "user", "content": "".join(texts)}
    assert conversation_key([joined]) == conversation_key([{"role": "user", "content": parts}])
    one_part = {"role": "user", "content": [{"type": "text", "text": "".join(texts)}]}
    assert messages_digest([joined]) == messages_digest([one_part])


def test_a_template_without_tool_roles_gets_hermes_blocks() -> None:
    from orl.schemas.messages import plain_template_messages

    call = {"id": "c1", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    tool = {"type": "function", "function": {"name": "ls"}}
    plain = plain_template_messages(
        [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "looking", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ],
        [tool],
    )
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[0]["content"].startswith("You may call functions.") and '"name": "ls"' in plain[0]["content"]
    assert (
        plain[2]["content"]
        == 'looking\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    )
    assert plain[3]["content"] == '<tool_response name="c1">\na.txt\n</tool_response>'
