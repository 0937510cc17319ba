"""What a client appended to a conversation between two main turns (the previous turn's next state).

The previous turn is remembered by a digest of its messages (not the messages: OpenClaw re-sends
~11k tokens of history per turn, so state stays small). Messages are compared by role and readable
text (`orl.schemas.messages.messages_digest`), so a client that re-sends a string content as a list of
text parts still matches. Reads and writes no topics.
"""

from __future__ import annotations

from orl.schemas.messages import Message, message_role, messages_digest

PREFIX = "prefix"
AFTER_LAST_ASSISTANT = "after_last_assistant"


def appended_messages(
    previous_count: int, previous_digest: str, current: list[Message]
) -> tuple[list[Message], str]:
    """The messages of `current` that came after the previous turn's prompt and its response.

    If the previous prompt is a prefix of `current`, everything after it except the assistant
    response itself (all tool results and the new user message, not only the last message).
    Otherwise (the client rewrote or compacted history) everything after the last assistant message.
    Returns (messages, how they were found).
    """
    is_prefix = (
        len(current) >= previous_count and messages_digest(current[:previous_count]) == previous_digest
    )
    if is_prefix:
        rest = current[previous_count:]
        if rest and message_role(rest[0]) == "assistant":
            rest = rest[1:]
        return rest, PREFIX
    for index in range(len(current) - 1, -1, -1):
        if message_role(current[index]) == "assistant":
            return current[index + 1 :], AFTER_LAST_ASSISTANT
    return current[-1:], AFTER_LAST_ASSISTANT
