"""GPT-OSS through openai-harmony, as vLLM 0.33.0 builds the prompt (not through the Jinja template).

OpenAI-style messages become harmony messages the way vLLM 0.33.0 does it for Chat Completions:
`OnlineRenderer._make_request_with_harmony` (vllm/renderers/online_renderer.py) with, from
vllm/entrypoints/openai/parser/harmony_utils.py, `extract_instructions_from_messages`, `build_harmony_preamble`,
`parse_chat_inputs_to_harmony_messages` / `parse_chat_input_to_harmony_message`, `auto_drop_analysis_messages` and
`render_for_completion`. The steps are re-implemented here (vLLM itself is not a dependency):
  - a leading system/developer message is peeled off as instructions and goes into the developer message
    (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset), together with the request's function tools;
  - the system message carries reasoning effort and the conversation start date;
  - assistant `reasoning` (or `reasoning_content`, which vLLM renames to `reasoning`) becomes an analysis message;
    `thinking` is not read by vLLM and is ignored here too; tool calls become commentary messages to
    `functions.NAME` with content type `json`; tool results come from `functions.NAME` (name found by tool_call_id);
  - analysis messages before the last assistant final message are dropped, then rendered with
    auto_drop_analysis off.
vLLM 0.33.0's `_use_legacy_tool_call_headers` rewrites `<|constrain|>` headers of openai-harmony >= 0.0.10; 0.0.8
already renders the legacy header (`assistant to=functions.x<|channel|>commentary json`), so it is a no-op here.

kwargs understood: `reasoning_effort` ("low" | "medium" | "high" | None: harmony's default, Medium),
`conversation_start_date` (default: VLLM_SYSTEM_START_DATE, else today, as vLLM does; pin it for reproducible
prompts).

Provenance: the conversation is rendered prefix by prefix; the tokens each harmony message adds belong to the chat
message it came from (-1 for the system message, the tool list, and the generation prompt). No template lines
exist, so `source_line` is 0.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from typing import Any

from engine.errors import AssetError, RenderError
from engine.types import Rendered

MODEL_ID = "gpt-oss"
HARMONY_VERSION = "0.0.8"
SOURCE_PATH = "openai-harmony 0.0.8 (vllm 0.33.0 parse_chat_inputs_to_harmony_messages)"
REASONING_EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class _Sourced:
    message: Any  # openai_harmony.Message
    origin: int  # index of the chat message it came from, -1 for scaffolding
    own_text: str | None = None  # for the developer message: the peeled instructions, the only part from `origin`


def load_harmony_encoding():
    """openai-harmony's GPT-OSS encoding, offline (TIKTOKEN_ENCODINGS_BASE -> the rebuilt o200k_base.tiktoken)."""
    from engine.render.harmony_encoding import o200k_base_path

    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_base_path().parent)
    try:
        from openai_harmony import HarmonyEncodingName
        from openai_harmony import load_harmony_encoding as load
    except ImportError as err:
        raise AssetError(
            f"{MODEL_ID}: openai-harmony is not installed: pip install openai-harmony=={HARMONY_VERSION}."
        ) from err
    try:
        return load(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as err:
        raise AssetError(f"{MODEL_ID}: openai-harmony cannot load the GPT-OSS encoding offline: {err}.") from err


class HarmonyRenderer:
    origin = f"openai-harmony {HARMONY_VERSION}"
    source_path = SOURCE_PATH
    understood_kwargs = ("reasoning_effort", "conversation_start_date")

    def __init__(self, encoding: Any | None = None) -> None:
        self._encoding = encoding or load_harmony_encoding()

    @property
    def encoding(self) -> Any:
        return self._encoding

    def source_lines(self) -> list[str]:
        return []

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        *,
        add_generation_prompt: bool = True,
        kwargs: dict | None = None,
    ) -> Rendered:
        try:
            sourced = self.harmony_messages(messages, tools, kwargs or {})
            return self._render(sourced, add_generation_prompt)
        except RenderError:
            raise
        except Exception as err:
            raise RenderError(
                f"{MODEL_ID}: openai-harmony {HARMONY_VERSION} refused the conversation: {type(err).__name__}: {err}",
                model=MODEL_ID,
                path=SOURCE_PATH,
            ) from err

    def conversation(self, messages: list[dict], tools: list[dict] | None, kwargs: dict | None = None) -> Any:
        """The openai_harmony.Conversation vLLM would render for this request."""
        from openai_harmony import Conversation

        return Conversation.from_messages([s.message for s in self.harmony_messages(messages, tools, kwargs or {})])

    # -- vLLM 0.33.0 conversion --------------------------------------------------------------------------------

    def harmony_messages(self, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> list[_Sourced]:
        remaining = list(enumerate(_with_reasoning_renamed(m) for m in messages))
        instructions: str | None = None
        instructions_origin = -1
        if remaining and remaining[0][1].get("role") in ("system", "developer"):
            instructions_origin, first = remaining.pop(0)
            instructions = _flatten_text(first.get("content"))
        sourced = [_Sourced(_system_message(kwargs), -1)]
        if instructions or tools:
            developer = _developer_message(instructions, tools)
            sourced.append(_Sourced(developer, instructions_origin if instructions else -1, instructions))
        tool_names = {
            call.get("id"): call.get("function", {}).get("name")
            for _, message in remaining
            for call in message.get("tool_calls") or []
        }
        for index, message in remaining:
            sourced.extend(_Sourced(h, index) for h in _chat_message_to_harmony(message, tool_names))
        return _drop_early_analysis(sourced)

    # -- rendering with provenance ----------------------------------------------------------------------------

    def _render(self, sourced: list[_Sourced], add_generation_prompt: bool) -> Rendered:
        from openai_harmony import Conversation, RenderConversationConfig, Role

        config = RenderConversationConfig(auto_drop_analysis=False)
        harmony = [s.message for s in sourced]
        conversation = Conversation.from_messages(harmony)
        if add_generation_prompt:
            final = self._encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config=config)
        else:
            final = self._encoding.render_conversation_for_training(conversation, config=config)
        boundaries = [0]
        for count in range(1, len(harmony) + 1):
            prefix = self._encoding.render_conversation(Conversation.from_messages(harmony[:count]), config=config)
            if final[: len(prefix)] != prefix:
                boundaries.append(boundaries[-1])  # only the training render changes the last message's end
                continue
            boundaries.append(len(prefix))
        text_parts: list[str] = []
        message_index: list[int] = []
        for number, item in enumerate(sourced):
            start = boundaries[number]
            end = boundaries[number + 1] if number + 1 < len(sourced) or add_generation_prompt else len(final)
            piece = self._encoding.decode_utf8(final[start:end])
            text_parts.append(piece)
            message_index.extend(_piece_owners(piece, item))
        tail = self._encoding.decode_utf8(final[boundaries[-1] :]) if add_generation_prompt else ""
        text_parts.append(tail)
        message_index.extend([-1] * len(tail))
        text = "".join(text_parts)
        whole = self._encoding.decode_utf8(final)
        if text != whole:
            raise RenderError(
                f"{MODEL_ID}: incremental rendering does not add up to the whole prompt in openai-harmony "
                f"{HARMONY_VERSION}; provenance cannot be given.",
                model=MODEL_ID,
                path=SOURCE_PATH,
            )
        return Rendered(
            text=whole,
            message_index=tuple(message_index),
            source_line=(0,) * len(whole),
            source_path=SOURCE_PATH,
            origin=self.origin,
        )


def _piece_owners(piece: str, item: _Sourced) -> list[int]:
    if item.own_text is None:
        return [item.origin] * len(piece)
    # The developer message mixes the peeled instructions (from a chat message) with the tool list (request).
    owners = [-1] * len(piece)
    at = piece.find(item.own_text)
    if at >= 0:
        owners[at : at + len(item.own_text)] = [item.origin] * len(item.own_text)
    return owners


def _with_reasoning_renamed(message: dict) -> dict:
    # vllm/entrypoints/openai/chat_completion/protocol.py _normalize_messages_before.
    converted = dict(message)
    reasoning_content = converted.pop("reasoning_content", None)
    if reasoning_content is not None and converted.get("reasoning") is None:
        converted["reasoning"] = reasoning_content
    return converted


def _flatten_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [item if isinstance(item, str) else item.get("text") for item in content if isinstance(item, str | dict)]
    texts = [t for t in texts if t is not None]
    return "".join(texts) if texts else None


def _system_message(kwargs: dict) -> Any:
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent

    content = SystemContent.new()
    effort = kwargs.get("reasoning_effort")
    if effort is not None:
        if effort == "none" or effort not in REASONING_EFFORTS:
            raise RenderError(
                f"{MODEL_ID}: reasoning_effort={effort!r} is not supported by Harmony "
                f"(vLLM 0.33.0 accepts {', '.join(REASONING_EFFORTS)}).",
                model=MODEL_ID,
                path=SOURCE_PATH,
            )
        content = content.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    start_date = kwargs.get("conversation_start_date") or os.environ.get("VLLM_SYSTEM_START_DATE")
    start_date = start_date or datetime.datetime.now().strftime("%Y-%m-%d")
    content = content.with_conversation_start_date(start_date)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(instructions: str | None, tools: list[dict] | None) -> Any:
    from openai_harmony import DeveloperContent, Message, Role, ToolDescription

    content = DeveloperContent.new()
    if instructions is not None:
        content = content.with_instructions(instructions)
    descriptions = []
    for tool in tools or []:
        kind = tool.get("type")
        if kind in ("web_search_preview", "code_interpreter", "container"):
            continue
        if kind != "function":
            raise RenderError(f"{MODEL_ID}: tool type {kind!r} is not supported.", model=MODEL_ID, path=SOURCE_PATH)
        function = tool.get("function", {})
        descriptions.append(
            ToolDescription.new(
                name=function.get("name"),
                description=function.get("description") or "",
                parameters=function.get("parameters"),
            )
        )
    if descriptions:
        content = content.with_function_tools(descriptions)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _chat_message_to_harmony(message: dict, tool_names: dict) -> list[Any]:
    from openai_harmony import Author, Message, Role, TextContent

    role = message.get("role")
    tool_calls = message.get("tool_calls") or []
    result: list[Any] = []
    if role == "assistant" and tool_calls:
        content = _flatten_text(message.get("content"))
        if content:
            result.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("commentary"))
        if message.get("reasoning"):
            result.append(Message.from_role_and_content(Role.ASSISTANT, message["reasoning"]).with_channel("analysis"))
        for call in tool_calls:
            function = call.get("function", {})
            arguments = function.get("arguments", "") or ""
            if not isinstance(arguments, str):
                # Clients may send arguments as an object; harmony message content must be text.
                arguments = json.dumps(arguments, ensure_ascii=False)
            call_message = Message.from_role_and_content(Role.ASSISTANT, arguments)
            recipient = f"functions.{function.get('name', '')}"
            call_message = call_message.with_channel("commentary").with_recipient(recipient)
            result.append(call_message.with_content_type("json"))
        return result
    if role == "tool":
        name = tool_names.get(message.get("tool_call_id", ""), "")
        content = _flatten_text(message.get("content")) or ""
        tool_message = Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), content)
        return [tool_message.with_channel("commentary").with_recipient("assistant")]
    if role == "assistant" and message.get("reasoning"):
        result.append(Message.from_role_and_content(Role.ASSISTANT, message["reasoning"]).with_channel("analysis"))
    content = message.get("content") or ""
    if isinstance(content, str):
        contents = [TextContent(text=content)]
    else:
        contents = [TextContent(text=c.get("text", "")) for c in content]
    if role == "assistant" and contents and contents[0].text:
        result.append(Message.from_role_and_contents(role, contents).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = _flatten_text(message.get("content"))
        if instructions is not None:
            result.append(_developer_message(instructions, None))
    elif role != "assistant":
        result.append(Message.from_role_and_contents(role, contents))
    return result


def _drop_early_analysis(sourced: list[_Sourced]) -> list[_Sourced]:
    # vLLM 0.33.0 auto_drop_analysis_messages: analysis before the last assistant final message is dropped.
    last_final = max(
        (i for i, s in enumerate(sourced) if s.message.author.role == "assistant" and s.message.channel == "final"),
        default=-1,
    )
    return [s for i, s in enumerate(sourced) if not (i < last_final and s.message.channel == "analysis")]
