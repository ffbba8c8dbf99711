"""Evidence of a break: the token window around it, and exports that reproduce it (JSON, Markdown, HTML, CSV).

`break_view` lines up both sides of the first break token by token (id, text, special, which message and which
template line produced it). `cell_evidence` is everything needed to recompute a cell: model and asset hashes, engine
version, kwargs, the scenario, every completion's exact text and ids, and both sides around the break; `replay`
recomputes the cell from that and lists what differs. The Markdown is for bug reports; the HTML page is
self-contained (inline CSS, no scripts) with the side-by-side token diff.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import html
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ExplorerError
from engine.matrix import cell_json, cell_label
from engine.models import LoadedModel, load_model
from engine.prefix import common_prefix
from engine.scenario import SCENARIOS_DIR, load_scenario, load_yaml, preamble_library
from engine.simulate import Boundary, Cause, CellResult, run_cell, run_cell_with
from engine.tokenize import Tokenizer
from engine.types import Rendered, Tokens

EVIDENCE_FORMAT = "drift-evidence/1"
COMPLETION = -2  # message index of characters the model itself produced (not rendered by the template)


@dataclass(frozen=True)
class TokenRow:
    position: int  # index in its sequence
    id: int | None  # None on a string-level view (no tokenizer): the row is one character span instead
    text: str
    special: bool
    message_index: int  # -1 template scaffolding, COMPLETION the model's own output
    source_line: int  # template line (0 unknown or model output)
    differs: bool  # at or after the first position where the two sides differ


@dataclass(frozen=True)
class SideView:
    label: str
    rows: tuple[TokenRow, ...]
    char_start: int
    text: str  # the character window shown for this side


@dataclass(frozen=True)
class BreakView:
    """Both sides of one boundary around its first difference."""

    boundary: int
    level: str  # "token" | "string"
    first_token: int | None
    first_char: int
    prev: SideView  # previous prompt + completion
    next: SideView  # next prompt
    char_opcodes: tuple[tuple[str, int, int, int, int], ...]  # difflib opcodes over the two character windows
    source_path: str


def visible(text: str) -> str:
    """Whitespace made visible: space ·, tab →, newline ↵ (the line break itself is kept for readability)."""
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n")


def _char_provenance(rendered: Rendered, extra: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return rendered.message_index + (COMPLETION,) * extra, rendered.source_line + (0,) * extra


def _token_starts(tokenizer: Tokenizer, segments: list[tuple[str, tuple[int, ...]]]) -> list[int]:
    """Character start of every token of the concatenated segments.

    Exact from the tokenizer's offsets where a segment's ids are its whole-string tokenization; otherwise (a sampled
    non-canonical tokenization, bridge ids) from the lengths of decoded prefixes.
    """
    starts: list[int] = []
    base = 0
    for text, ids in segments:
        tokens = tokenizer.encode(text)
        if tokens.ids == tuple(ids):
            starts.extend(base + start for start, _ in tokens.offsets)
        else:
            starts.extend(base + len(tokenizer.decode(ids[:i])) for i in range(len(ids)))
        base += len(text)
    return starts


def _rows(tokenizer: Tokenizer, ids: tuple[int, ...], starts: tuple[int, ...], lo: int, hi: int, first: int,
          message_index: tuple[int, ...], source_line: tuple[int, ...]) -> tuple[TokenRow, ...]:
    rows = []
    for i in range(lo, min(hi, len(ids))):
        at = min(starts[i], len(message_index) - 1) if message_index else 0
        rows.append(TokenRow(i, ids[i], tokenizer.token_text(ids[i]), tokenizer.is_special(ids[i]),
                             message_index[at] if message_index else -1, source_line[at] if source_line else 0,
                             i >= first))
    return tuple(rows)


def _char_rows(text: str, lo: int, hi: int, first: int, message_index: tuple[int, ...],
               source_line: tuple[int, ...]) -> tuple[TokenRow, ...]:
    """String-level rows: maximal runs of characters from one message and one template line."""
    rows: list[TokenRow] = []
    start = lo
    hi = min(hi, len(text))
    for i in range(lo + 1, hi + 1):
        cut = i == hi or i == first or (message_index[i], source_line[i]) != (message_index[start], source_line[start])
        if cut:
            rows.append(TokenRow(start, None, text[start:i], False, message_index[start], source_line[start],
                                 start >= first))
            start = i
    return tuple(rows)


def _word_start(text: str, at: int, reach: int = 24) -> int:
    """`at` moved back (at most `reach` characters) to where a word or a `<…>` marker starts."""
    for i in range(at, max(0, at - reach) - 1, -1):
        if i == 0 or text[i] == "<" or text[i - 1].isspace() or text[i - 1] == ">":
            return i
    return at


def _word_end(text: str, at: int, reach: int = 24) -> int:
    """`at` moved forward (at most `reach` characters) to where a word or a `<…>` marker ends."""
    for i in range(min(at, len(text)), min(len(text), at + reach) + 1):
        if i == len(text) or text[i].isspace() or text[i] == "<" or text[i - 1] == ">":
            return i
    return min(at, len(text))


@dataclass(frozen=True)
class CompareSide:
    """One side of a comparison: text with per-character provenance, and its token ids with their char starts."""

    label: str
    text: str
    message_index: tuple[int, ...]
    source_line: tuple[int, ...]
    ids: tuple[int, ...] | None = None
    starts: tuple[int, ...] | None = None


def compare(tokenizer: Tokenizer | None, prev: CompareSide, nxt: CompareSide, *, boundary: int, source_path: str,
            context: int = 8) -> BreakView:
    """The two sequences side by side around their first difference, `context` tokens (or spans) each way."""
    first_char = common_prefix(prev.text, nxt.text)
    token_level = tokenizer is not None and None not in (prev.ids, nxt.ids, prev.starts, nxt.starts)
    if token_level:
        assert tokenizer is not None and prev.ids is not None and nxt.ids is not None
        assert prev.starts is not None and nxt.starts is not None
        first = common_prefix(prev.ids, nxt.ids)
        lo, hi = max(0, first - context), first + context
        prev_rows = _rows(tokenizer, prev.ids, prev.starts, lo, hi, first, prev.message_index, prev.source_line)
        next_rows = _rows(tokenizer, nxt.ids, nxt.starts, lo, hi, first, nxt.message_index, nxt.source_line)

        def at(side: CompareSide, i: int) -> int:
            assert side.starts is not None
            return side.starts[i] if i < len(side.starts) else len(side.text)

        prev_lo, next_lo, prev_hi, next_hi = at(prev, lo), at(nxt, lo), at(prev, hi), at(nxt, hi)
        first_token: int | None = first
    else:
        span = context * 6
        # No tokens: the window still starts and ends where a word or a marker does, not inside one.
        prev_lo = next_lo = _word_start(prev.text, max(0, first_char - span))
        prev_hi, next_hi = _word_end(prev.text, first_char + span), _word_end(nxt.text, first_char + span)
        prev_rows = _char_rows(prev.text, prev_lo, prev_hi, first_char, prev.message_index, prev.source_line)
        next_rows = _char_rows(nxt.text, next_lo, next_hi, first_char, nxt.message_index, nxt.source_line)
        first_token = None
    prev_window, next_window = prev.text[prev_lo:prev_hi], nxt.text[next_lo:next_hi]
    if token_level:
        assert prev.starts is not None and nxt.starts is not None
        prev_cuts = {c - prev_lo for c in prev.starts if prev_lo <= c <= prev_hi} | {len(prev_window)}
        next_cuts = {c - next_lo for c in nxt.starts if next_lo <= c <= next_hi} | {len(next_window)}
        cut = at(prev, first) - prev_lo

        def kept(a1: int, a2: int, b1: int, b2: int) -> bool:
            return a2 - a1 >= 4
    else:
        cut = first_char - prev_lo

        def kept(a1: int, a2: int, b1: int, b2: int) -> bool:  # no token boundaries: only long common runs
            return a2 - a1 >= 8
    raw_opcodes = difflib.SequenceMatcher(None, prev_window, next_window, autojunk=False).get_opcodes()
    if token_level:
        raw_opcodes = [raw_opcodes[0], *_whole_tokens(raw_opcodes[1:], prev_cuts, next_cuts)] if raw_opcodes else []
    opcodes = _readable(raw_opcodes, cut, kept)
    return BreakView(
        boundary=boundary,
        level="token" if token_level else "string",
        first_token=first_token,
        first_char=first_char,
        prev=SideView(prev.label, prev_rows, prev_lo, prev_window),
        next=SideView(nxt.label, next_rows, next_lo, next_window),
        char_opcodes=tuple(opcodes),
        source_path=source_path,
    )


def break_view(model: LoadedModel, boundary: Boundary, context: int = 8) -> BreakView:
    """A matrix cell's boundary: previous prompt + completion against the next prompt."""
    prev_msg, prev_line = _char_provenance(boundary.prev_prompt, len(boundary.completion.text))
    next_msg, next_line = _char_provenance(boundary.next_prompt)
    tokenizer = model.tokenizer
    prev_ids, next_ids = boundary.prev_ids, boundary.next_ids
    prev_starts = next_starts = None
    if tokenizer is not None and prev_ids is not None and next_ids is not None:
        assert boundary.prev_prompt_ids is not None and boundary.completion_ids is not None
        prev_starts = tuple(_token_starts(tokenizer, [(boundary.prev_prompt.text, boundary.prev_prompt_ids),
                                                      (boundary.completion.text, boundary.completion_ids)]))
        next_starts = tuple(_token_starts(tokenizer, [(boundary.next_prompt.text, next_ids)]))
    prev = CompareSide("previous prompt + completion", boundary.prev_text, prev_msg, prev_line, prev_ids, prev_starts)
    nxt = CompareSide("next prompt", boundary.next_prompt.text, next_msg, next_line, next_ids, next_starts)
    return compare(tokenizer, prev, nxt, boundary=boundary.index, source_path=boundary.next_prompt.source_path,
                   context=context)


def rendered_sequence(label: str, rendered: Rendered, tokens: Tokens | None) -> CompareSide:
    """A rendered text (and its tokenization, if any) as one side of `compare`."""
    return CompareSide(label, rendered.text, rendered.message_index, rendered.source_line,
                    tokens.ids if tokens else None, tuple(start for start, _ in tokens.offsets) if tokens else None)


SOURCE_REPOS = {
    "vllm": "https://github.com/vllm-project/vllm/blob/v{version}/{path}",
    "sglang": "https://github.com/sgl-project/sglang/blob/v{version}/python/{path}",
}


def source_url(origin: str, path: str, line: int, end_line: int | None = None, hub_repo: str = "",
               hub_file: str = "") -> str | None:
    """A link to the blamed line: the engine's source at that version, or the template file on the Hub."""
    anchor = f"#L{line}" + (f"-L{end_line}" if end_line and end_line != line else "")
    name, _, rest = origin.partition(" ")
    version = rest.split(" ")[0]  # "vllm 0.33.0 encoder": the engine's own file at that release
    if name in SOURCE_REPOS and version:
        return SOURCE_REPOS[name].format(version=version, path=path) + anchor
    if origin.startswith("template") and hub_repo and hub_file:
        return f"https://huggingface.co/{hub_repo}/blob/main/{hub_file}{anchor}"
    return None


def cause_url(cause: Cause, model: LoadedModel) -> str | None:
    where = cause.location
    if where.line < 0:  # no line of its code is known
        return None
    hub_file = model.spec.assets["chat_template"].hub_file if "chat_template" in model.spec.assets else ""
    return source_url(cause.origin, where.path, where.line, where.end_line, model.spec.hub_repo, hub_file)


@dataclass(frozen=True)
class ErrorExplanation:
    """Why an error cell has no PRR result: where it failed (with the lines around it and a link), why, and what
    would let the request render."""

    location: str | None  # "template.jinja:314", when the failure names a template line
    url: str | None
    excerpt: tuple[tuple[int, str], ...]  # (line number, text) around the failing line
    line: int | None
    why: str
    fix: str


# What each kind of failure means and what lets the request render; matched on the failure's sentence (data).
ERROR_KINDS: tuple[tuple[str, str, str], ...] = (
    (r"'dict object' has no attribute '(?P<key>\w+)'",
     "the template reads `message.{key}` unconditionally, and the message the client sent back for the model's "
     "turn has no {key!r} key (an engine returns an empty answer as null, and the request drops null keys).",
     "send the key (an empty string rather than null) or guard the line with `message.{key} is defined`"),
    (r"rejects the next request",
     "the engine refused to build the next request from the history the client sent back.",
     "send the history in the form the engine accepts (see the engine's sentence above)"),
    (r"\(render (time|output) limit\)|limit\)$",
     "the template did not finish within the sandbox's limits.",
     "look for an unbounded loop or recursion in the template"),
    (r"raised at line|failed at line",
     "the template failed while rendering the request that follows the model's turn.",
     "make the template accept this conversation (see the line highlighted)"),
)
_FAILED_LINE = re.compile(r"(?:raised|failed) at line (\d+)")


def source_excerpt(lines: list[str], line: int, around: int = 3, end: int | None = None
                   ) -> tuple[tuple[int, str], ...]:
    """(line number, text) of the lines around `line` (or the span `line`..`end`), whole (never cut)."""
    last = end or line
    return tuple((n, lines[n - 1]) for n in range(max(1, line - around), min(len(lines), last + around) + 1))


def explain_error(cell: CellResult, model: LoadedModel, around: int = 3) -> ErrorExplanation | None:
    """The explanation of an error cell (None for any other status)."""
    if cell.status != "error" or not cell.note:
        return None
    found = _FAILED_LINE.search(cell.note)
    line = int(found.group(1)) if found else None
    location = url = None
    from engine.serving.rendering import cell_model

    model = cell_model(cell, model)  # the renderer the cell's engine used: its lines are what the note cites
    excerpt: tuple[tuple[int, str], ...] = ()
    if line is not None:
        lines = model.renderer.source_lines()
        path = model.renderer.source_path
        location = f"{path}:{line}"
        hub_file = model.spec.assets["chat_template"].hub_file if "chat_template" in model.spec.assets else ""
        url = source_url("template", path, line, None, model.spec.hub_repo, hub_file) if "+" not in cell.model \
            else None  # an upload has no public copy to link to
        excerpt = source_excerpt(lines, line, around)
    why, fix = "the request could not be rendered.", "see the sentence above"
    for pattern, why_text, fix_text in ERROR_KINDS:
        matched = re.search(pattern, cell.note)
        if matched:
            why, fix = why_text.format(**matched.groupdict()), fix_text.format(**matched.groupdict())
            break
    others = _engines_where_it_renders(cell)
    if others:
        fix += f"; {', '.join(others)} render{'s' if len(others) == 1 else ''} this scenario for {cell.model}"
    return ErrorExplanation(location, url, excerpt, line, why, fix)


def _engines_where_it_renders(cell: CellResult) -> list[str]:
    """The other engines (at their versions) whose cell for the same stock model and scenario is not an error."""
    from engine.serving.registry import list_engines

    if "+" in cell.model:
        return []
    current = engine_spec(cell)
    out = []
    for engine in (*list_engines(), "bridge"):
        if engine == current:
            continue
        other = run_cell(cell.model, cell.scenario, engine, dict(cell.kwargs))
        if other.status in ("holds", "breaks"):
            out.append(f"{engine_spec(other)} ({other.status})")
    return out


Opcode = tuple[str, int, int, int, int]


def _whole_tokens(opcodes: list[Opcode], prev_cuts: set[int], next_cuts: set[int]) -> list[Opcode]:
    """Each equal run narrowed to the part that is whole tokens on both sides (the rest joins the changes)."""
    out: list[Opcode] = []
    for tag, a1, a2, b1, b2 in opcodes:
        if tag != "equal":
            out.append((tag, a1, a2, b1, b2))
            continue
        lead = next((d for d in range(a2 - a1 + 1) if a1 + d in prev_cuts and b1 + d in next_cuts), None)
        tail = next((d for d in range(a2 - a1 + 1) if a2 - d in prev_cuts and b2 - d in next_cuts), None)
        if lead is None or tail is None or a1 + lead >= a2 - tail:
            out.append(("replace", a1, a2, b1, b2))
            continue
        if lead:
            out.append(("replace", a1, a1 + lead, b1, b1 + lead))
        out.append(("equal", a1 + lead, a2 - tail, b1 + lead, b2 - tail))
        if tail:
            out.append(("replace", a2 - tail, a2, b2 - tail, b2))
    return out


def _readable(opcodes: list[Opcode], cut: int, kept: Callable[[int, int, int, int], bool]) -> list[Opcode]:
    """The character diff as a reader pairs it: the common prefix ends at `cut` (the start of the first differing
    token, so `<think>` vs `<tool_call>` is one change, not `<t` + `hink>` vs `ool_call>`), and an equal run after
    the first change is kept only where `kept` says it is a real common part (whole tokens on both sides) —
    otherwise "call" of "should call" would be paired with "call" of "tool_call"."""
    if opcodes and opcodes[0][0] == "equal" and opcodes[0][2] > cut and len(opcodes) > 1:
        _, _, a2, _, _ = opcodes[0]
        tag, _, na2, _, nb2 = opcodes[1]
        opcodes = [("equal", 0, cut, 0, cut), ("replace", cut, na2, cut, nb2), *opcodes[2:]]
    out: list[Opcode] = []
    for i, (tag, a1, a2, b1, b2) in enumerate(opcodes):
        if tag == "equal" and (i == 0 or kept(a1, a2, b1, b2)):
            out.append((tag, a1, a2, b1, b2))
        elif out and out[-1][0] != "equal":
            _, pa1, _, pb1, _ = out[-1]
            out[-1] = ("replace", pa1, a2, pb1, b2)
        else:
            out.append(("replace", a1, a2, b1, b2))
    return [("delete" if b1 == b2 else "insert" if a1 == a2 else tag, a1, a2, b1, b2) if tag == "replace" else
            (tag, a1, a2, b1, b2) for tag, a1, a2, b1, b2 in out if a1 != a2 or b1 != b2]


def _focus_break(cell: CellResult) -> Boundary | None:
    return next((b for b in cell.boundaries if not b.holds), None)


def _view_json(view: BreakView) -> dict:
    def side(s: SideView) -> dict:
        return {"label": s.label, "char_start": s.char_start, "text": s.text,
                "tokens": [{"position": r.position, "id": r.id, "text": r.text, "special": r.special,
                            "message_index": r.message_index, "source_line": r.source_line, "differs": r.differs}
                           for r in s.rows]}

    return {"boundary": view.boundary, "level": view.level, "first_token": view.first_token,
            "first_char": view.first_char, "source_path": view.source_path, "previous": side(view.prev),
            "next": side(view.next)}


def _scenario_json(scenario_id: str) -> dict:
    scenario = load_scenario(scenario_id)
    path = SCENARIOS_DIR.parent / scenario.source
    data = path.read_bytes()
    out = {"id": scenario.id, "description": scenario.description, "source": scenario.source,
           "sha256": hashlib.sha256(data).hexdigest(), "data": load_yaml(data, scenario.source)}
    if scenario.preamble:
        text = preamble_library()[scenario.preamble]
        out["preamble"] = {"name": scenario.preamble, "source": "scenarios/preambles.yaml",
                           "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    return out


def engine_spec(cell: CellResult) -> str:
    """The engine argument that recomputes this cell ("vllm@0.33.0", "raw", "raw@minijinja", ...)."""
    if cell.column:  # a column with layers names them (issue 27)
        return cell.column
    return f"{cell.engine}@{cell.engine_version}" if cell.engine_version else cell.engine


def upload_json(workspace_root: str | Path, upload_id: str) -> dict:
    """What replaying a custom-template cell needs: the base model, the label, and each uploaded file with its
    sha256; the template and tokenizer_config.json with their text (a tokenizer file only by name and hash: replay
    reads it from the workspace, as it may be 50 MB)."""
    from engine.uploads import TEXT_ROLES
    from engine.workspace import Workspace

    workspace = Workspace(workspace_root)
    upload = workspace.get(upload_id)
    files = {}
    for stored in upload.files:
        entry = {"name": stored.name, "sha256": stored.sha256}
        if stored.role in TEXT_ROLES:
            entry["text"] = workspace.read_file(upload, stored.role).decode("utf-8")
        files[stored.role] = entry
    return {"id": upload.id, "base_model": upload.base_model, "label": upload.label, "files": files}


def upload_model(upload: dict, where: str) -> LoadedModel:
    """The custom model an evidence file describes, validated and rebuilt in a temporary workspace (a tokenizer
    file is taken, by its sha256, from the uploads in $DRIFT_WORKSPACE)."""
    import tempfile

    from engine.workspace import Workspace, default_root

    try:
        base, label, described = upload["base_model"], upload["label"], upload["files"]
        files: dict[str, tuple[str, bytes]] = {}
        for role, entry in described.items():
            if "text" in entry:
                files[role] = (entry["name"], entry["text"].encode("utf-8"))
                continue
            data = _stored_file(Workspace(default_root()), entry["sha256"])
            if data is None:
                raise ExplorerError(f"{where}: the upload's {entry['name']} (sha256 {entry['sha256'][:12]}…) is not "
                                    f"in the evidence and not in the workspace {default_root()}: upload it there to "
                                    "replay this cell")
            files[role] = (entry["name"], data)
    except (KeyError, TypeError, AttributeError) as err:
        raise ExplorerError(f"{where}: the evidence's upload is malformed: missing {err}") from err
    with tempfile.TemporaryDirectory(prefix="drift-replay-") as folder:
        workspace = Workspace(folder)
        return workspace.load_model(workspace.add(base, files, label).id)


def _stored_file(workspace, sha256: str) -> bytes | None:
    for stored_upload in workspace.list().uploads:
        for stored in stored_upload.files:
            if stored.sha256 == sha256:
                return workspace.read_file(stored_upload, stored.role)
    return None


def cell_evidence(cell: CellResult, model: LoadedModel, context: int = 8, upload: dict | None = None) -> dict:
    """Everything needed to reproduce and show one cell (`upload`: upload_json of a custom-template cell's upload,
    so that the evidence carries the template it ran)."""
    focus = _focus_break(cell)
    boundaries = []
    for b in cell.boundaries:
        boundaries.append({
            **{k: v for k, v in _boundary_figures(b).items()},
            "completion": {"text": b.completion.text, "ids": list(b.completion_ids) if b.completion_ids else None,
                           "stop_token": b.completion.stop_token, "truncated": b.completion.truncated},
            "parse": b.parse.to_json(),
            "request_edits": [{"step": e.step, "before": e.before, "after": e.after, "description": e.description,
                               "location": str(e.location), "origin": e.location.origin} for e in b.request_edits],
            "previous_prompt": b.prev_prompt.text,
            "next_prompt": b.next_prompt.text,
        })
    return {
        "format": EVIDENCE_FORMAT,
        "reproduce": {"model": cell.model, "scenario": cell.scenario, "engine": engine_spec(cell),
                      "kwargs": cell.kwargs},
        "asset_hashes": dict(sorted(cell.asset_hashes.items())),
        "asset_sources": dict(sorted(model.asset_sources.items())),
        "serving": {"renderer": cell.renderer, "request_side": cell.request_side},
        "scenario": _scenario_json(cell.scenario),
        "result": cell_json(cell),
        "boundaries": boundaries,
        "break": _view_json(break_view(model, focus, context)) if focus else None,
        **({"upload": upload} if upload is not None else {}),
    }


def _boundary_figures(b: Boundary) -> dict:
    return {"index": b.index, "trigger": b.trigger, "string_prefix": b.string_prefix.to_json(),
            "token_prefix": b.token_prefix.to_json() if b.token_prefix else None,
            "reused_tokens": b.reused_tokens, "prefill_tokens": b.prefill_tokens}


def matrix_evidence(cells: list[CellResult], models: dict[str, LoadedModel] | None = None) -> dict:
    models = models or {}
    return {"format": EVIDENCE_FORMAT,
            "cells": [cell_evidence(c, models.get(c.model) or load_model(c.model)) for c in cells]}


# ---- Markdown -------------------------------------------------------------------------------------------------


def _fence(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def cell_markdown(cell: CellResult, model: LoadedModel, context: int = 8) -> str:
    """A bug-report section: the facts, the two sides of the break with visible whitespace, the cause."""
    out = [f"### {cell.model} × {cell.scenario} × {engine_spec(cell)}: {cell.status}", ""]
    kwargs = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cell.kwargs.items())) or "(none)"
    out.append(f"- template kwargs: {kwargs}")
    if cell.renderer:
        out.append(f"- rendered by: {cell.renderer}; request side: {cell.request_side}")
    for name, digest in sorted(cell.asset_hashes.items()):
        out.append(f"- asset `{name}` sha256 `{digest}`")
    if cell.note:
        out.append(f"- note: {cell.note}")
    explained = explain_error(cell, model)
    if explained is not None:
        if explained.location:
            out += ["", f"Failed at `{explained.location}`" + (f" ({explained.url})" if explained.url else "") + ":",
                    "", _fence("\n".join(f"{n:>4}{'>' if n == explained.line else ' '} {text}"
                                         for n, text in explained.excerpt))]
        out += ["", f"**Why**: {explained.why}", "", f"**Fix**: {explained.fix}"]
    focus = _focus_break(cell)
    if focus is None:
        last = cell.boundaries[-1] if cell.boundaries else None
        if last is not None:
            out.append(f"- every boundary holds; last one reuses {last.reused_tokens} tokens")
        return "\n".join(out) + "\n"
    s = focus.string_prefix
    out.append(f"- boundary {focus.index} (client appended a {focus.trigger} message): string prefix "
               f"{s.common}/{s.prev_len} chars" + (f", token prefix {focus.token_prefix.common}/"
                                                   f"{focus.token_prefix.prev_len} tokens, prefill "
                                                   f"{focus.prefill_tokens}" if focus.token_prefix else ""))
    if cell.cause:
        c = cell.cause
        out += ["", f"**Cause** ({c.stage}, {c.kind}: {c.explanation}): `{c.location}` in {c.origin}", "", c.changed]
        if c.line_text:
            out += ["", _fence(c.line_text)]
        out += [f"- {'emitted at' if n else 'changed by'} `{loc}`: `{loc.text}`" for n, loc in
                enumerate(c.locations)]
        out += ["", f"Proof: {c.proof}"]
        if c.fix:
            out += ["", f"**Fix**: {c.fix.text} ({c.fix.proof})"]
    view = break_view(model, focus, context)
    out += ["", f"Previous prompt + completion, from char {view.prev.char_start} (break at {view.first_char}):", "",
            _fence(visible(view.prev.text)), "", f"Next prompt, from char {view.next.char_start}:", "",
            _fence(visible(view.next.text))]
    if view.level == "token":
        out += ["", "| # | previous id | previous text | next id | next text |", "|---|---|---|---|---|"]
        for a, b in zip(view.prev.rows, view.next.rows):
            mark = " **≠**" if a.id != b.id else ""
            out.append(f"| {a.position}{mark} | {a.id} | `{_cell_text(a.text)}` | {b.id} | `{_cell_text(b.text)}` |")
    return "\n".join(out) + "\n"


def _cell_text(text: str) -> str:
    return visible(text).replace("\n", "").replace("|", "\\|").replace("`", "ˋ")


def matrix_markdown(cells: list[CellResult]) -> str:
    """The matrix as a table (a row per scenario, a column per model × engine), then each cause with its fix."""
    models = list(dict.fromkeys(c.model for c in cells))
    # Keyed by engine@version: two versions of one engine are two columns, each header naming its version.
    engines = list(dict.fromkeys(engine_spec(c) for c in cells))
    scenarios = list(dict.fromkeys(c.scenario for c in cells))
    by_key = {(c.scenario, c.model, engine_spec(c)): c for c in cells}
    header = "| scenario | " + " | ".join(f"{m} {e}" for m in models for e in engines) + " |"
    rule = "|---" * (1 + len(models) * len(engines)) + "|"
    rows = [header, rule]
    for s in scenarios:
        row = [s] + [cell_label(by_key[(s, m, e)]) if (s, m, e) in by_key else "" for m in models for e in engines]
        rows.append("| " + " | ".join(row) + " |")
    causes = [f"- {c.model} · {c.scenario} · {engine_spec(c)}: {c.cause.stage} {c.cause.location} ({c.cause.kind}); "
              f"fix: {c.cause.fix.text if c.cause.fix else '—'}" for c in cells if c.cause]
    return "\n".join(rows) + "\n\n" + "\n".join(causes) + "\n"


# ---- HTML -------------------------------------------------------------------------------------------------------

EVIDENCE_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#1b1f24}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:2em;border-top:1px solid #ccc;padding-top:1em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #d0d7de;padding:2px 6px;vertical-align:top}
.tok{font-family:ui-monospace,monospace;white-space:pre} .special{color:#8250df;font-weight:600}
.differs{background:#ffebe9} .first td{background:#ff8182;font-weight:700}
.cause{background:#fff8c5;border:1px solid #d4a72c;padding:.6em;margin:.6em 0}
.holds{color:#1a7f37} .breaks{color:#cf222e} .error{color:#9a6700} .unavailable{color:#57606a}
pre{background:#f6f8fa;padding:.5em;white-space:pre-wrap} del{background:#ffcecb} ins{background:#aceebb}
"""


def side_by_side_html(view: BreakView) -> str:
    """The token rows of both sides in one table, the first differing row marked (classes from EVIDENCE_CSS)."""
    rows = []
    for a, b in zip(view.prev.rows, view.next.rows):
        first = " class='first'" if a.position == view.first_token else (" class='differs'" if a.differs else "")
        rows.append(
            f"<tr{first}><td>{a.position}</td>"
            f"<td>{a.id}</td><td class='tok{' special' if a.special else ''}'>{html.escape(visible(a.text))}</td>"
            f"<td>{_origin(a)}</td>"
            f"<td>{b.id}</td><td class='tok{' special' if b.special else ''}'>{html.escape(visible(b.text))}</td>"
            f"<td>{_origin(b)}</td></tr>")
    return ("<table><tr><th>#</th><th colspan=3>previous prompt + completion (id, text, from)</th>"
            "<th colspan=3>next prompt (id, text, from)</th></tr>" + "".join(rows) + "</table>")


def _origin(row: TokenRow) -> str:
    if row.message_index == COMPLETION:
        return "model output"
    where = f"message {row.message_index}" if row.message_index >= 0 else "template"
    return f"{where}, line {row.source_line}" if row.source_line else where


def char_diff_html(view: BreakView) -> str:
    a, b = view.prev.text, view.next.text
    parts = []
    for op, a1, a2, b1, b2 in view.char_opcodes:
        if op == "equal":
            parts.append(html.escape(visible(a[a1:a2])))
        if op in ("delete", "replace"):
            parts.append(f"<del>{html.escape(visible(a[a1:a2]))}</del>")
        if op in ("insert", "replace"):
            parts.append(f"<ins>{html.escape(visible(b[b1:b2]))}</ins>")
    return "<pre>" + "".join(parts) + "</pre>"


def cell_html_section(cell: CellResult, model: LoadedModel, context: int = 8) -> str:
    title = f"{cell.model} × {cell.scenario} × {engine_spec(cell)}"
    out = [f"<h2 id='{html.escape(title)}'>{html.escape(title)}: <span class='{cell.status}'>{cell.status}</span>"
           "</h2>"]
    kwargs = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cell.kwargs.items())) or "(none)"
    out.append(f"<p>template kwargs: <code>{html.escape(kwargs)}</code></p>")
    if cell.note:
        out.append(f"<p>{html.escape(cell.note)}</p>")
    focus = _focus_break(cell)
    if focus is None:
        return "\n".join(out)
    if cell.cause:
        c = cell.cause
        fix = f"<br><b>Fix:</b> {html.escape(c.fix.text)} ({html.escape(c.fix.proof)})" if c.fix else ""
        line = f"<pre>{html.escape(c.line_text)}</pre>" if c.line_text else ""
        emitted = "".join(f"<br>emitted at <code>{html.escape(str(loc))}</code>: <code>{html.escape(loc.text)}</code>"
                          for loc in c.locations[1:])
        out.append(f"<div class='cause'><b>Cause</b> ({html.escape(c.stage)}, {html.escape(c.kind)}: "
                   f"{html.escape(c.explanation)}): <code>{html.escape(str(c.location))}</code> in "
                   f"{html.escape(c.origin)}"
                   f"<br>{html.escape(c.changed)}{line}{emitted}<br>Proof: {html.escape(c.proof)}{fix}</div>")
    view = break_view(model, focus, context)
    s = focus.string_prefix
    out.append(f"<p>Boundary {focus.index}: first difference at char {view.first_char} ({s.common}/{s.prev_len} "
               "chars kept)" + (f", token {view.first_token} ({focus.token_prefix.common}/{focus.token_prefix.prev_len}"
                                f" tokens kept, {focus.prefill_tokens} to prefill)" if focus.token_prefix else "")
               + "</p>")
    if view.level == "token":
        out.append(side_by_side_html(view))
    out.append("<p>Character diff of the window (<del>previous only</del>, <ins>next only</ins>):</p>")
    out.append(char_diff_html(view))
    return "\n".join(out)


def evidence_html(cells: list[CellResult], models: dict[str, LoadedModel] | None = None, context: int = 8) -> str:
    """A self-contained page: a summary table, then one section per cell that does not hold."""
    models = models or {}
    summary = "".join(
        f"<tr><td>{html.escape(c.model)}</td><td>{html.escape(c.scenario)}</td><td>{html.escape(engine_spec(c))}</td>"
        f"<td class='{c.status}'>{html.escape(cell_label(c))}</td></tr>" for c in cells)
    sections = [cell_html_section(c, models.get(c.model) or load_model(c.model), context)
                for c in cells if c.status != "holds" or len(cells) == 1]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>PRR evidence</title>"
            f"<style>{EVIDENCE_CSS}</style></head><body><h1>Parse-render roundtrip evidence</h1>"
            "<table><tr><th>model</th><th>scenario</th><th>engine</th><th>result</th></tr>"
            f"{summary}</table>{''.join(sections)}</body></html>\n")


def matrix_csv(cells: list[CellResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "scenario", "engine", "engine_version", "status", "string_common", "string_prev_len",
                     "token_common", "token_prev_len", "reused_tokens", "prefill_tokens", "cause_stage", "cause_kind",
                     "cause_location", "fix"])
    for c in cells:
        f = c.focus
        t = f.token_prefix if f else None
        writer.writerow([c.model, c.scenario, c.engine, c.engine_version, c.status,
                         f.string_prefix.common if f else "", f.string_prefix.prev_len if f else "",
                         t.common if t else "", t.prev_len if t else "",
                         f.reused_tokens if f and f.reused_tokens is not None else "",
                         f.prefill_tokens if f and f.prefill_tokens is not None else "",
                         c.cause.stage if c.cause else "", c.cause.kind if c.cause else "",
                         str(c.cause.location) if c.cause else "", c.cause.fix.text if c.cause and c.cause.fix else ""])
    return buf.getvalue()


# ---- replay -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayReport:
    cells: int
    differences: tuple[str, ...]

    @property
    def matches(self) -> bool:
        return not self.differences


_COMPARED = ("status", "string_prefix", "token_prefix", "reused_tokens", "prefill_tokens")


def _replay_one(evidence: dict, where: str) -> list[str]:
    try:
        return _replay_checked(evidence, where)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        # The file was checked for what it names (model, scenario, engine, kwargs); the rest is compared as found.
        raise ExplorerError(f"{where}: not drift evidence: a {type(err).__name__} reading {str(err)[:80]}") from None


def _check_kwargs(kwargs: dict, model: LoadedModel, where: str) -> None:
    """Template kwargs from a file: names are identifiers, and a kwarg the model declares has its default's type
    (scenario kwargs the model does not declare pass through, as they do in the matrix)."""
    declared = {k.name: k.default for k in model.spec.template_kwargs}
    for name, value in kwargs.items():
        if not name.isidentifier():
            raise ExplorerError(f"{where}: reproduce.kwargs holds {name[:40]!r}, which is not a template kwarg name")
        default = declared.get(name)
        if default is not None and type(value) is not type(default):
            raise ExplorerError(f"{where}: reproduce.kwargs {name} must be {type(default).__name__} for "
                                f"{model.id}, got {json.dumps(value)[:40]}")


def _replay_checked(evidence: dict, where: str) -> list[str]:
    from engine.serving.registry import known_engine

    try:
        repro = evidence["reproduce"]
        model_id, scenario_id, engine, kwargs = repro["model"], repro["scenario"], repro["engine"], repro["kwargs"]
    except (KeyError, TypeError) as err:
        raise ExplorerError(f"{where}: not drift evidence: missing {err}") from err
    if not isinstance(evidence.get("result"), dict):
        raise ExplorerError(f"{where}: not drift evidence: \"result\" must be an object")
    if not isinstance(kwargs, dict):
        raise ExplorerError(f"{where}: reproduce.kwargs must be an object, not {type(kwargs).__name__}")
    try:
        if not isinstance(model_id, str):
            raise ValueError(f"unknown model of type {type(model_id).__name__}")
        load_scenario(scenario_id)
        engine = known_engine(engine)
    except (ExplorerError, ValueError) as err:
        raise ExplorerError(f"{where}: reproduce names {err}") from None
    upload = evidence.get("upload")
    model = upload_model(upload, where) if upload is not None else load_model(model_id)
    _check_kwargs(kwargs, model, where)
    diffs = []
    for name, digest in evidence.get("asset_hashes", {}).items():
        now = model.asset_hashes.get(name)
        if now != digest:
            diffs.append(f"{where}: asset {name} sha256 was {digest[:12]}…, is now {(now or 'absent')[:12]}…")
    scenario_now = _scenario_json(scenario_id)
    if scenario_now["sha256"] != evidence.get("scenario", {}).get("sha256"):
        diffs.append(f"{where}: scenario file {scenario_now['source']} changed since the export")
    if scenario_now.get("preamble") != evidence.get("scenario", {}).get("preamble"):
        diffs.append(f"{where}: the scenario's preamble in scenarios/preambles.yaml changed since the export")
    cell = run_cell_with(model, scenario_id, engine, kwargs) if upload is not None else \
        run_cell(model_id, scenario_id, engine, kwargs)
    now = cell_evidence(cell, model, upload=upload)
    label = f"{where} ({model_id} × {scenario_id} × {engine})"
    for key in _COMPARED:
        if now["result"][key] != evidence["result"].get(key):
            diffs.append(f"{label}: {key} was {evidence['result'].get(key)}, is now {now['result'][key]}")
    old_cause, new_cause = evidence["result"].get("cause"), now["result"]["cause"]
    for key in ("stage", "kind", "location"):
        a = old_cause.get(key) if old_cause else None
        b = new_cause.get(key) if new_cause else None
        if a != b:
            diffs.append(f"{label}: cause {key} was {a}, is now {b}")
    for old_b, new_b in zip(evidence.get("boundaries", []), now["boundaries"]):
        if old_b["completion"] != new_b["completion"]:
            diffs.append(f"{label}: boundary {old_b['index']} completion text or ids differ")
        if old_b["next_prompt"] != new_b["next_prompt"]:
            diffs.append(f"{label}: boundary {old_b['index']} next prompt differs")
    if len(evidence.get("boundaries", [])) != len(now["boundaries"]):
        diffs.append(f"{label}: {len(evidence.get('boundaries', []))} boundaries before, {len(now['boundaries'])} now")
    if evidence.get("break") != now["break"]:
        diffs.append(f"{label}: the token window around the break differs")
    return diffs


def replay(path: Path) -> ReplayReport:
    """Recompute every cell of an exported evidence file and list what no longer matches."""
    from engine.uploads import UploadLimits, json_document, read_path

    limits = UploadLimits.from_env()
    data = json_document(read_path(path, "an evidence JSON file", limits.max_tokenizer_bytes,
                                   limits.cap_setting("tokenizer")), str(path))
    if not isinstance(data, dict) or data.get("format") != EVIDENCE_FORMAT:
        raise ExplorerError(f"{path}: not a {EVIDENCE_FORMAT} file (format is {repr(data.get('format'))[:40]})"
                            if isinstance(data, dict) else f"{path}: not a {EVIDENCE_FORMAT} file")
    items = data["cells"] if "cells" in data else [data]
    if not isinstance(items, list) or not items or not all(isinstance(item, dict) for item in items):
        raise ExplorerError(f"{path}: \"cells\" must be a non-empty list of cell evidence objects")
    diffs: list[str] = []
    for i, item in enumerate(items):
        diffs += _replay_one(item, f"{path.name}[{i}]" if "cells" in data else path.name)
    return ReplayReport(len(items), tuple(diffs))
