"""Runs the REAL engine parser classes on cases; executed by generate.py inside the throw-away venv.

Usage: python oracle_runner.py ENGINE ROOT < jobs.json > results.json
ENGINE is "vllm" or "sglang"; ROOT is the folder holding the unpacked wheel's top-level package.
Each result is {"id", "mode", "output": {reasoning, content, tool_calls} | None, "error": str | None}.
The serving-layer glue below mirrors the engines' chat-completion handlers (cited per step).
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shims  # noqa: E402

logging.disable(logging.CRITICAL)


def _accumulate_tool_delta(calls: dict[int, dict], index: int, call_id, name, arguments) -> None:
    entry = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
    if call_id and entry["id"] is None:
        entry["id"] = call_id
    if name:
        entry["name"] += name
    if arguments:
        entry["arguments"] += arguments


# ---------------------------------------------------------------- SGLang
def _sglang_version() -> tuple[int, ...]:
    from sglang.version import __version__

    return tuple(int(part) for part in __version__.split(".")[:3])


def run_sglang(job: dict) -> dict:
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    tools = [Tool(**t) for t in job["tools"]] if job["tools"] else []
    history = job.get("history_tool_calls", 0)
    tool_name = job["tool_parser"]

    def call_id(name: str, index: int) -> str:
        # serving_chat.py _process_tool_call_id
        if tool_name == "kimi_k2":
            return f"functions.{name}:{history + index}"
        return "call_<uuid>"

    tool_parsing_active = bool(tool_name and tools)

    def make_reasoning_parser(stream_reasoning: bool) -> ReasoningParser:
        # serving_chat.py passes tool_call_parser_active where the version has it (0.5.23, not 0.5.12)
        kwargs = {}
        if "tool_call_parser_active" in inspect.signature(ReasoningParser.__init__).parameters:
            kwargs["tool_call_parser_active"] = tool_parsing_active
        return ReasoningParser(job["reasoning_parser"], stream_reasoning, True, **kwargs)

    if job["mode"] == "ns":
        text = job["text"]
        reasoning = None
        if job["reasoning_parser"]:
            parser = make_reasoning_parser(False)
            reasoning, text = parser.parse_non_stream(text)
        tool_calls = []
        if tool_name and tools:
            fcp = FunctionCallParser(tools, tool_name)
            if fcp.has_tool_call(text):
                try:
                    remaining, items = fcp.parse_non_stream(text)
                    text = remaining
                    for index, item in enumerate(items):
                        tool_calls.append(
                            {"id": call_id(item.name, index), "name": item.name, "arguments": item.parameters}
                        )
                except Exception:  # serving_chat: log and keep the original text
                    pass
        return {
            "reasoning": reasoning if reasoning else None,
            # serving_chat.py: 0.5.23 sends an empty answer as "" (2997), 0.5.12 as null (1190)
            "content": text if text else ("" if _sglang_version() >= (0, 5, 23) else None),
            "tool_calls": tool_calls,
        }

    chunks = job["chunks"]
    rparser = make_reasoning_parser(True) if job["reasoning_parser"] else None
    fcp = FunctionCallParser(tools, tool_name) if tool_name and tools else None
    reasoning_out, content_out = "", ""
    calls: dict[int, dict] = {}
    for position, chunk in enumerate(chunks):
        finished = position == len(chunks) - 1
        delta = chunk
        if rparser is not None:
            r_text, delta = rparser.parse_stream_chunk(delta)
            if finished and hasattr(rparser, "parse_stream_end"):
                end_r, end_n = rparser.parse_stream_end()
                if end_r:
                    r_text = (r_text or "") + end_r
                if end_n:
                    delta = (delta or "") + end_n
            reasoning_out += r_text or ""
        delta = delta or ""
        if fcp is not None:
            normal, items = fcp.parse_stream_chunk(delta)
            if finished and hasattr(fcp, "parse_stream_end"):
                end_text, end_items = fcp.parse_stream_end()
                normal = (normal or "") + end_text
                items = list(items) + list(end_items)
            content_out += normal or ""
            for item in items:
                cid = call_id(item.name, item.tool_index) if item.name else None
                _accumulate_tool_delta(calls, item.tool_index, cid, item.name, item.parameters)
            if finished:
                remaining = _sglang_unstreamed_args(fcp)
                if remaining is not None:
                    _accumulate_tool_delta(calls, remaining[0], None, None, remaining[1])
        else:
            content_out += delta
    return {
        "reasoning": reasoning_out or None,
        "content": content_out or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }


def _sglang_unstreamed_args(fcp) -> tuple[int, str] | None:
    # serving_chat.py _check_for_unstreamed_tool_args
    detector = getattr(fcp, "detector", fcp)
    prev = getattr(detector, "prev_tool_call_arr", None)
    streamed = getattr(detector, "streamed_args_for_tool", None)
    if not prev or not streamed:
        return None
    index = len(prev) - 1
    if index < 0 or index >= len(streamed):
        return None
    expected = prev[index].get("arguments", {})
    expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
    actual = streamed[index]
    remaining = expected[len(actual) :] if expected.startswith(actual) else ""
    return (index, remaining) if remaining else None


# ---------------------------------------------------------------- vLLM
class FakeTokenizer:
    """Just enough tokenizer for the parsers: a vocab of the family's added tokens plus one ordinary id; the special
    ones (all_special_tokens) are those the real tokenizer lists, not every added token."""

    def __init__(self, special_tokens: dict[str, int], not_special: list[str] | None = None) -> None:
        self._vocab = dict(special_tokens)
        special = {t: i for t, i in special_tokens.items() if t not in set(not_special or ())}
        self.all_special_tokens = list(special)
        self.all_special_ids = list(special.values())

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def convert_tokens_to_ids(self, token):
        if isinstance(token, list):
            return [self._vocab.get(t, 0) for t in token]
        return self._vocab.get(token, 0)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self._vocab.get(text, ORDINARY_TOKEN_ID)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        inverse = {v: k for k, v in self._vocab.items()}
        return "".join(inverse.get(i, "") for i in ids)


ORDINARY_TOKEN_ID = 11


class HarmonyTokenizer(FakeTokenizer):
    """GPT-OSS jobs carry real o200k_harmony ids: decode them as the model's tokenizer would.

    vLLM returns the decoded tokens of an unfinished message as content (parser/harmony.py:136-159), so a stand-in
    that decodes only special tokens would lose that text.
    """

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS).decode(list(ids))


class _HfConfig:
    def __init__(self, model_type: str) -> None:
        self.model_type = model_type


class FakeModelConfig:
    def __init__(self, model_type: str) -> None:
        self.hf_config = _HfConfig(model_type)
        self.hf_text_config = self.hf_config
        self.hf_overrides = {}


def _chunk_token_ids(chunk: str, specials: dict[str, int]) -> list[int]:
    return [specials[chunk]] if chunk in specials else [ORDINARY_TOKEN_ID]


def _normalise_vllm_id(call_id: str | None) -> str:
    # message_assembly.py:116 and tool_call.py:32 give random ids "chatcmpl-tool-<uuid>"; keep only the prefix.
    if not call_id or call_id.startswith("chatcmpl-tool-"):
        return "chatcmpl-tool-<uuid>"
    return call_id


def run_vllm(job: dict) -> dict:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    specials: dict[str, int] = job["special_tokens"]
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        model="m",
        tools=job["tools"] or None,
        tool_choice="auto" if job["tools"] else None,
        chat_template_kwargs=job.get("chat_template_kwargs") or None,
    )
    parser_cls = ParserManager.get_parser(
        tool_parser_name=job["tool_parser"],
        reasoning_parser_name=job["reasoning_parser"],
        enable_auto_tools=True,
        is_harmony=job.get("harmony", False),
    )
    tokenizer = HarmonyTokenizer(specials) if job.get("harmony") else FakeTokenizer(specials, job.get("not_special"))
    model_config = FakeModelConfig(job.get("model_type", "generic"))
    parser = parser_cls(
        tokenizer, request.tools, chat_template_kwargs=job.get("chat_template_kwargs") or {}, model_config=model_config
    )
    prompt_ids = [specials.get(t, ORDINARY_TOKEN_ID) for t in job.get("prompt_tail", [])]
    if job["mode"] == "ns":
        if prompt_ids:
            parser.set_prompt_token_ids(prompt_ids)
        output_ids = (job["token_ids"] if job["token_ids"] is not None
                      else [i for c in job["chunks"] for i in _chunk_token_ids(c, specials)])
        reasoning, content, calls = parser.parse(
            job["text"], request, enable_auto_tools=True, model_output_token_ids=output_ids
        )
        # message_assembly.py:60-70: keeps_tool_calls (tools + auto) else drop; ids from make_tool_call_id
        keep = bool(job["tools"])
        tool_calls = []
        for call in (calls or []) if keep else []:
            tool_calls.append({"id": _normalise_vllm_id(call.id), "name": call.name, "arguments": call.arguments})
        return {"reasoning": reasoning, "content": content, "tool_calls": tool_calls}

    reasoning_out, content_out = None, None
    acc: dict[int, dict] = {}
    chunks = job["chunks"]
    for position, chunk in enumerate(chunks):
        chunk_ids = (
            job["token_ids"][position : position + 1]
            if job["token_ids"] is not None
            else _chunk_token_ids(chunk, specials)
        )
        delta = parser.parse_delta(
            chunk, chunk_ids, request, prompt_token_ids=prompt_ids or None, finished=position == len(chunks) - 1
        )
        if delta is not None and delta.tool_calls and not job["tools"]:
            # stream_processor.py:84-90: a request without tools keeps no streamed calls (and no empty delta)
            delta.tool_calls = []
            if not delta.content and not delta.reasoning:
                delta = None
        if delta is None:
            continue
        if delta.reasoning:
            reasoning_out = (reasoning_out or "") + delta.reasoning
        if delta.content:
            content_out = (content_out or "") + delta.content
        for tc in delta.tool_calls or []:
            function = tc.function
            cid = _normalise_vllm_id(tc.id) if tc.id else None
            _accumulate_tool_delta(
                acc,
                tc.index,
                cid,
                getattr(function, "name", None) if function else None,
                getattr(function, "arguments", None) if function else None,
            )
    return {"reasoning": reasoning_out, "content": content_out, "tool_calls": [acc[i] for i in sorted(acc)]}


# ---------------------------------------------------------------- main
def main() -> None:
    engine, root = sys.argv[1], Path(sys.argv[2])
    shims.install(engine, root, extra_real=("openai_harmony",) if engine == "vllm" else ())
    jobs = json.load(sys.stdin)
    runner = run_sglang if engine == "sglang" else run_vllm
    results = []
    for job in jobs:
        try:
            results.append({"id": job["id"], "output": runner(job), "error": None})
        except Exception as exc:  # the real engine fails the request
            results.append(
                {
                    "id": job["id"],
                    "output": None,
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=3),
                }
            )
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
