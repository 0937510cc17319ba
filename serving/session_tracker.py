"""Which session and turn a chat request belongs to (pure logic, no I/O).

A session comes from, in order: the `X-Session-Id` header, a `session_id` key in the body, OpenAI's
`user` field, the `prompt_cache_key` field (stock OpenClaw sends `<sessionId>:0` there when its
provider sets `compat.supportsPromptCacheKey`). When none is given, a request is linked to the earlier
main turn whose messages plus its response are a prefix of the new request's messages: that is how a
stock client (any SDK, a chat UI, OpenClaw without the fork) resends a conversation, so its turns
link without any header. The comparison is `orl.schemas.messages.conversation_link_keys`, lenient on what
clients change in an echoed reply (whitespace, text parts, `null` vs "" content, JSON formatting of
arguments, tool-call ids).

Stock OpenClaw ends every request with a user message of internal context that it does not keep in
its history, so its next request resends the earlier one without it. A response is therefore also
remembered after the request minus its trailing user messages, as long as what is left still ends in
a user or tool message. A conversation two sessions both answered alike (same key, different
sessions) links to neither: a new session is safer than a turn chained into another conversation.
Linking by messages looks only among the sessions of the request's own API key (`owner`): another
key that resends the same conversation starts a session of its own (orl.serving.tenancy).
Turn indexes are given at arrival, so concurrent requests in one session are ordered by request.
A session this tracker does not hold (new, closed, evicted, or from before a restart of the server)
continues from `stored_next_turn_index`, which the server answers from its spool file, where every
assignment is committed with the turn's events: a turn id is never given twice.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orl.schemas.messages import Message, conversation_key, conversation_link_keys

# conversation_key stays importable from here, where its tests and callers found it before.
__all__ = ["SessionTracker", "TurnAssignment", "conversation_key"]

# What a conversation key maps to once two different sessions have claimed it.
_AMBIGUOUS = ("", "")


@dataclass(frozen=True)
class TurnAssignment:
    session_id: str
    turn_id: str
    turn_index: int
    previous_turn_id: str | None
    link_method: str  # header | body | user | cache_key | prefix | new
    owner: str = ""  # the id of the API key the turn came with (its prefix links are kept under it)


@dataclass
class _SessionState:
    next_turn_index: int = 0
    last_main_turn_id: str | None = None
    closed: bool = False


@dataclass
class SessionTracker:
    """Assigns sessions and turns; remembers the last `max_conversations` main turns for prefix linking."""

    max_conversations: int = 100_000
    new_session_id: Callable[[], str] = field(default=lambda: "s-" + uuid.uuid4().hex[:16])
    stored_next_turn_index: Callable[[str], int] = field(default=lambda session_id: 0)
    _sessions: OrderedDict[str, _SessionState] = field(default_factory=OrderedDict)
    _by_conversation: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)

    def assign(
        self,
        messages: Sequence[Message],
        *,
        header_session: str | None = None,
        body_session: str | None = None,
        user: str | None = None,
        cache_key: str | None = None,
        main: bool = True,
        owner: str = "",
        new_session: bool = False,
        continues: str | None = None,
    ) -> TurnAssignment:
        """The session and turn of a request; `new_session`: a session of its own, whatever the
        request's messages continue (one choice of several); `continues`: the turn of the session it
        follows, when the caller knows it (a stored response's turn)."""
        session_id, method = self.explicit_session(header_session, body_session, user, cache_key)
        linked_turn: str | None = continues
        if new_session:
            session_id, method = self.new_session_id(), "new"
        elif session_id is None:
            found = self._find_prefix(messages, owner)
            if found is not None:
                session_id, linked_turn = found
                method = "prefix"
            else:
                session_id, method = self.new_session_id(), "new"
        state = self._session(session_id)
        index = state.next_turn_index
        state.next_turn_index += 1
        turn_id = f"{session_id}/t{index}"
        previous = linked_turn or state.last_main_turn_id
        if main:
            state.last_main_turn_id = turn_id
        return TurnAssignment(session_id, turn_id, index, previous if main else None, method, owner)

    def record_response(
        self, assignment: TurnAssignment, messages: Sequence[Message], reply: Message
    ) -> None:
        """Remember a main turn's conversation so the client's next request (which repeats it) links to it."""
        for sent in _resendable_requests(messages):
            self._remember(assignment.owner + conversation_link_keys([*sent, reply])[-1], assignment)

    def _remember(self, key: str, assignment: TurnAssignment) -> None:
        known = self._by_conversation.get(key)
        if known is not None and known[0] != assignment.session_id:
            self._by_conversation[key] = _AMBIGUOUS
        else:
            self._by_conversation[key] = (assignment.session_id, assignment.turn_id)
        self._by_conversation.move_to_end(key)
        while len(self._by_conversation) > self.max_conversations:
            self._by_conversation.popitem(last=False)

    def last_main_turn(self, session_id: str) -> str | None:
        """The session's latest main turn id, or None when the session is unknown or closed."""
        state = self._sessions.get(session_id)
        return state.last_main_turn_id if state is not None else None

    def close(self, session_id: str) -> bool:
        """Mark a session closed; True if it was open. A later request with the same id starts it again."""
        state = self._sessions.pop(session_id, None)
        return state is not None and not state.closed

    def explicit_session(
        self, header: str | None, body: str | None, user: str | None, cache_key: str | None
    ) -> tuple[str | None, str]:
        """The session a request names (and how), or (None, "new") when it names none."""
        if header:
            return header, "header"
        if body:
            return body, "body"
        if user:
            return f"user:{user}", "user"
        if cache_key:
            return f"cache:{cache_key}", "cache_key"
        return None, "new"

    def _find_prefix(self, messages: Sequence[Message], owner: str) -> tuple[str, str] | None:
        # The longest earlier conversation wins: try prefixes ending in an assistant message, longest first.
        keys = conversation_link_keys(messages)
        for end in range(len(messages) - 1, 0, -1):
            if messages[end - 1].get("role") != "assistant":
                continue
            found = self._by_conversation.get(owner + keys[end - 1])
            if found is not None:
                return None if found == _AMBIGUOUS else found
        return None

    def _session(self, session_id: str) -> _SessionState:
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = _SessionState(self.stored_next_turn_index(session_id))
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_conversations:
            self._sessions.popitem(last=False)
        return state


def _resendable_requests(messages: Sequence[Message]) -> list[Sequence[Message]]:
    """The request as sent, then without 1, 2, ... of its trailing user messages.

    Only while what is left still ends in a user or tool message: a client resends a conversation
    without the context it appended last, never an assistant reply without the message it answered.
    """
    forms: list[Sequence[Message]] = [messages]
    end = len(messages)
    while end > 1 and messages[end - 1].get("role") == "user":
        end -= 1
        if messages[end - 1].get("role") not in ("user", "tool"):
            break
        forms.append(messages[:end])
    return forms
