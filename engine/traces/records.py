"""What every trace reader hands on: one request as the server or the client recorded it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import ExplorerError


class TraceFormatError(ExplorerError):
    """A trace file that cannot be read: one sentence naming the file, the line or record, and what is wrong.

    `where` is the line or record alone ("line 12", "steps[3]"), when the error is about one."""

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(message)
        self.where = where


class SkippedRecords(list):
    """The bad records a lenient read left out (read_trace's `skipped`): the first `kept` of them, and how many there
    were in all (`count`), so that a file of a million bad lines holds no million sentences."""

    def __init__(self, kept: int = 100) -> None:
        super().__init__()
        self.kept = kept
        self.count = 0

    def append(self, err: TraceFormatError) -> None:
        self.count += 1
        if len(self) < self.kept:
            super().append(err)


def skipped_sentence(skipped: list[TraceFormatError] | tuple[TraceFormatError, ...], shown: int = 5,
                     total: int | None = None) -> str:
    """One sentence for the bad records a lenient read skipped: the first one's own sentence, then where the others
    are; `total`: how many there were, when `skipped` holds only the first ones (default: its count or length)."""
    total = total if total is not None else getattr(skipped, "count", len(skipped))
    first = str(skipped[0]).rstrip(".")
    if total == 1:
        return f"{first} (that record was skipped, the rest of the file was read)"
    wheres = [e.where or "?" for e in skipped[1:shown]]
    more = ", …" if total > shown else ""
    return f"{first} ({total} bad records were skipped: this one and {', '.join(wheres)}{more}; the rest of " \
           "the file was read)"


@dataclass(frozen=True)
class TraceRequest:
    """One model call. Token ids are the ground truth where the format logs them; messages where it has them.

    `session` is the format's own session / conversation / trajectory id (None: group by shared prefix).
    `where` says where in the file the request was read ("line 12", "steps[3]"), for messages about it.
    """

    format: str
    request_id: str
    where: str
    session: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    completion_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    completion_text: str | None = None  # the text the server returned (after its parsers), when logged
    messages: tuple[dict, ...] | None = field(default=None, repr=False)  # what the client sent
    tools: tuple[dict, ...] | None = field(default=None, repr=False)
    response_message: dict | None = field(default=None, repr=False)  # the assistant message the server returned
    model: str | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None  # what the server says it reused, when it says
    chat_template_kwargs: dict[str, Any] | None = None
    order: int = 0  # where its first record is (a line number): sessions and requests are ordered by it

    @property
    def has_ids(self) -> bool:
        return self.prompt_ids is not None and self.completion_ids is not None
