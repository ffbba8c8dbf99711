"""Which session each request of a trace belongs to: the conversation it continues.

A request's session is found, in this order:

1. By the format's own id (`TraceRequest.session`: verifiers' `trajectory_id`, ATIF's `session_id`, a body's
   `session_id` / `conversation_id`, SGLang's `session_params.id`).
2. By its messages, where the format logs them. A request continues the session whose latest request's messages are
   a prefix of its own, followed by the assistant turn the model produced between them (as the client sent it back:
   with or without its reasoning). The prefix holds exactly (every message equal) or as said: what the system, the
   user and the tools said is equal and the assistant turns stand where they stood (a client that re-sends earlier
   turns without their reasoning). Preferred: the longer prefix, then an exact one; among sessions whose latest
   messages are the same (n samples of one prompt), the one whose reply this request sends back (the message the
   server returned, else its logged output text), then the one whose sequence shares the longest token prefix with
   this prompt, then the oldest.
   A request that continues no session but holds a session's first request (as said) and is longer than it: the
   client rewrote that session's history (a summary, dropped turns); it joins that session, where the rewrite shows
   as a break.
3. By its token ids, for a request logged without messages (a vLLM log without JSON bodies, an SGLang log without
   rids), or one with messages whose session was so far logged without them: the earlier session whose latest
   sequence (prompt + completion) shares the longest token prefix with its prompt, provided the prompt is longer than
   that session's first prompt and holds it up to its generation prompt (`FIRST_PROMPT_SLACK` tokens short of its
   end at most); candidates are found through a hash chain of 16-token blocks (as vLLM's prefix cache keys blocks).

Else it starts a session: n samples of one prompt are n sessions. Where messages are logged the tokens do not decide
the session, so a template that rewrites the history (GLM drops earlier reasoning at a new user turn) breaks the
cache inside one session instead of splitting it.

One pass: each request is looked up through dictionaries keyed by hashes of its message prefixes (and of its token
blocks), so grouping costs what the request holds, not what the open sessions hold. `group_sessions` is the plain
function over `TraceRequest`s; `SessionGrouping` is its state, for a caller that assigns requests as they come.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.prefix import common_prefix
from engine.traces.records import TraceRequest

HASH_BLOCK = 16
FIRST_PROMPT_SLACK = 4  # a generation prompt past the role header: Qwen3 "<think>\n" is 2 tokens


def _chain(ids: tuple[int, ...]) -> Iterable[int]:
    """The hash of every whole 16-token block, each chained to the ones before it (vLLM's block keys)."""
    h = 0
    for start in range(0, len(ids) - HASH_BLOCK + 1, HASH_BLOCK):
        h = hash((h, ids[start:start + HASH_BLOCK]))
        yield h


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _as_said(message: dict) -> int:
    """What identifies a message in its conversation however a client re-sends it: the role and text of a system,
    user or tool message; an assistant turn by its place alone. (A hash of strings: no serialisation.)"""
    role = str(message.get("role"))
    return hash(role) if role == "assistant" else hash((role, _text(message.get("content"))))


@dataclass(frozen=True)
class MessageKeys:
    """A request's messages, their roles, each one as said (`_as_said`) and the chain of those (`said_chain[i]`
    stands for messages[:i + 1]). Exact equality is checked on the messages themselves, only for candidates."""

    messages: tuple[dict, ...]
    roles: tuple[str, ...]
    said: tuple[int, ...]
    said_chain: tuple[int, ...]


def message_keys(messages: Iterable[dict]) -> MessageKeys:
    messages = tuple(messages)
    said = tuple(_as_said(m) for m in messages)
    chain, h = [], 0
    for value in said:
        h = hash((h, value))
        chain.append(h)
    return MessageKeys(messages, tuple(str(m.get("role")) for m in messages), said, tuple(chain))


def _reply_parts(message: dict) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """An assistant message's content, reasoning and calls, as comparable values."""
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                pass
        calls.append((str(function.get("name")), json.dumps(arguments, sort_keys=True, ensure_ascii=False)))
    return _text(message.get("content")).strip(), _text(reasoning).strip(), tuple(calls)


def reply_agreement(returned: dict | None, output_text: str | None, sent: dict) -> int:
    """How much of the assistant turn a client sent back agrees with what a request returned: fields equal to the
    returned message's (content, reasoning, calls), else pieces found in the logged output text."""
    content, reasoning, calls = _reply_parts(sent)
    if returned is not None:
        theirs = _reply_parts(returned)
        return sum(mine == other for mine, other in zip((content, reasoning, calls), theirs) if mine or other)
    if output_text is None:
        return 0
    pieces = [content, reasoning] + [piece for call in calls for piece in call]
    return sum(1 for piece in pieces if piece and piece in output_text)


@dataclass
class _Open:
    """What grouping keeps of one session: its first request and its latest one."""

    key: str
    number: int  # in the order sessions were opened
    first_prompt: tuple[int, ...]
    first_said: tuple[int, ...] | None = None
    latest: MessageKeys | None = None
    reply: dict | None = None  # what the latest request returned, when logged
    output_text: str | None = None
    prompt: tuple[int, ...] = ()  # the latest request's ids
    completion: tuple[int, ...] = ()

    def sequence_prefix(self, prompt: tuple[int, ...]) -> int:
        """The token prefix `prompt` shares with this session's latest sequence (prompt + completion)."""
        common = common_prefix(self.prompt, prompt[:len(self.prompt)])
        if common < len(self.prompt) or not self.completion:
            return common
        return common + common_prefix(self.completion, prompt[len(self.prompt):len(self.prompt) + len(self.completion)])


class SessionGrouping:
    """Assigns each request to its session as it arrives (see the module docstring); keeps per session its first
    request's messages and prompt and its latest request, and one dictionary entry per distinct 16-token block of the
    sequences seen without messages."""

    def __init__(self) -> None:
        self.open: dict[str, _Open] = {}
        self._by_said: dict[int, list[str]] = {}  # chain hash (as said) of a session's latest messages -> sessions
        self._by_first: dict[int, list[str]] = {}  # chain hash (as said) of a session's first messages -> sessions
        self._deepest: dict[int, str] = {}  # block-chain hash -> the session whose latest sequence last held it

    @property
    def sessions(self) -> int:
        return len(self.open)

    def assign(self, request: TraceRequest, prompt: tuple[int, ...] | None = None,
               completion: tuple[int, ...] | None = None) -> str:
        """The key of the session `request` belongs to (`prompt` / `completion`: its ids when they are not logged
        but rendered)."""
        prompt = prompt if prompt is not None else request.prompt_ids or ()
        completion = completion if completion is not None else request.completion_ids or ()
        if request.session is not None:
            if request.session not in self.open:
                self.open[request.session] = _Open(request.session, len(self.open), ())
            return request.session
        keys = message_keys(request.messages) if request.messages else None
        key = None
        if keys is not None:
            key = self._continued(keys, prompt) or self._rewritten(keys, prompt)
        if key is None:
            key = self._by_tokens(prompt, messages_known=keys is not None)
        if key is None:
            kind, n = "conversation" if keys is not None else "prefix", len(self.open) + 1
            while f"{kind}-{n}" in self.open:  # a trace may name a session so itself
                n += 1
            key = f"{kind}-{n}"
            self.open[key] = _Open(key, len(self.open), prompt, keys.said if keys is not None else None)
            if keys is not None:
                self._by_first.setdefault(keys.said_chain[-1], []).append(key)
        self._keep(self.open[key], request, keys, prompt, completion)
        return key

    def _continued(self, keys: MessageKeys, prompt: tuple[int, ...]) -> str | None:
        """The session this request continues (step 2 of the module docstring)."""
        for i in range(len(keys.roles) - 1, 0, -1):
            if keys.roles[i] != "assistant":
                continue
            said = [k for k in self._by_said.get(keys.said_chain[i - 1], ())
                    if self.open[k].latest.said == keys.said[:i]]  # type: ignore[union-attr]
            if said:
                before = keys.messages[:i]
                exact = [k for k in said if self.open[k].latest.messages == before]  # type: ignore[union-attr]
                return self._best(exact or said, keys.messages[i], prompt)
        return None

    def _best(self, candidates: list[str], sent: dict, prompt: tuple[int, ...]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        scored = [(reply_agreement(s.reply, s.output_text, sent), s) for s in map(self.open.__getitem__, candidates)]
        top = max(score for score, _ in scored)
        tied = [s for score, s in scored if score == top]
        if len(tied) > 1 and prompt:
            longest = max(s.sequence_prefix(prompt) for s in tied)
            tied = [s for s in tied if s.sequence_prefix(prompt) == longest]
        return min(tied, key=lambda s: s.number).key

    def _rewritten(self, keys: MessageKeys, prompt: tuple[int, ...]) -> str | None:
        """A session whose first request this one holds, and outgrows: its client rewrote the history."""
        found: list[_Open] = []
        for i in range(len(keys.said) - 1, 0, -1):
            found += [s for s in map(self.open.__getitem__, self._by_first.get(keys.said_chain[i - 1], ()))
                      if s.first_said == keys.said[:i]]
        if not found:
            return None

        def shared(session: _Open) -> int:
            latest = session.latest.said if session.latest is not None else ()
            return next((n for n, (a, b) in enumerate(zip(latest, keys.said)) if a != b), min(len(latest),
                                                                                                len(keys.said)))

        return max(found, key=lambda s: (shared(s), s.sequence_prefix(prompt) if prompt else 0, -s.number)).key

    def _by_tokens(self, prompt: tuple[int, ...], messages_known: bool) -> str | None:
        """A session by the token prefix alone (step 3 of the module docstring); for a request whose messages are
        known (`messages_known`), only a session whose requests were logged without theirs (a log whose first
        JSON bodies are missing)."""
        candidate = None
        for h in _chain(prompt):
            owner = self._deepest.get(h)
            if owner is None:
                break
            candidate = owner
        if candidate is None or (messages_known and self.open[candidate].latest is not None):
            return None
        first = self.open[candidate].first_prompt
        # A later request of a session is longer than its first prompt: an equal prompt is another session (n
        # rollouts of one RL prompt), and so is one that parts from it before its generation prompt.
        if len(prompt) <= len(first) or common_prefix(prompt, first) < len(first) - FIRST_PROMPT_SLACK:
            return None
        return candidate

    def _keep(self, session: _Open, request: TraceRequest, keys: MessageKeys | None, prompt: tuple[int, ...],
              completion: tuple[int, ...]) -> None:
        """`request` is now its session's latest."""
        if keys is not None:
            if session.latest is not None:
                listed = self._by_said[session.latest.said_chain[-1]]
                listed.remove(session.key)
                if not listed:
                    del self._by_said[session.latest.said_chain[-1]]
            session.latest = keys
            self._by_said.setdefault(keys.said_chain[-1], []).append(session.key)
        session.reply, session.output_text = request.response_message, request.completion_text
        session.prompt, session.completion = prompt, completion
        for h in _chain(prompt + completion):
            self._deepest[h] = session.key


def group_sessions(requests: Iterable[TraceRequest]) -> Iterator[tuple[str, TraceRequest]]:
    """Each request with the key of its session, in the order given, as it comes (one pass; see the module
    docstring). A format's own session id is the key; otherwise `conversation-N` (grouped by messages) or
    `prefix-N` (by tokens), N counting the sessions opened so far."""
    grouping = SessionGrouping()
    for request in requests:
        yield grouping.assign(request), request
