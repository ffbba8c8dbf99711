"""Readers for the trace formats people have, each following one version of the code that writes it.

- `vllm-log`: vLLM 0.33.0's API-server log with --enable-log-requests --enable-log-outputs at --log-level DEBUG
  (vllm/entrypoints/serve/utils/request_logger.py: log_inputs, log_request_body, log_outputs; vllm/logger.py's
  line format).
- `sglang-log`: SGLang 0.5.23 with --log-requests --log-requests-level 3 --log-requests-format json
  (sglang/srt/utils/request_logger.py: request.received, request.received.openai, request.finished; log_json).
- `verifiers`: results.jsonl rollouts with the `trajectory` column (verifiers 0.1.8+ TrajectoryStep /
  TrajectoryStepTokens: tokens.prompt_ids, tokens.completion_ids), as prime-rl reads them.
- `verifiers-json`: the same rollouts saved as one JSON list (`json.dump(rollouts)`, a dataset's
  `to_json(lines=False)`), read whole.
- `atif`: an ATIF v1.4+ trajectory (the atif 1.8.0 package's schema: steps[].metrics.prompt_token_ids,
  completion_token_ids, cached_tokens).
- `openai-jsonl`: one {"request", "response"} object a line (chat completions; vLLM's prompt_token_ids and
  choices[].token_ids when the request sets return_token_ids). `python -m engine watch` writes it, with a "watch"
  object a line (engine/watch/record.py); an exchange it marks incomplete is kept in the file and not read as a
  request.
- `mini-swe-agent`: a trajectory_format "mini-swe-agent-1.x" file (mini-swe-agent 2.4.6 DefaultAgent.serialize).
- `swe-agent`: a SWE-agent 1.x .traj (DefaultAgent.get_trajectory_data: trajectory, history, info).

docs/traces.md has the table. Line formats are read line by line, keeping only the requests
still waiting for their output, so a log of any size streams (a line may hold up to MAX_LINE_BYTES). The trajectory
formats are one JSON document per trajectory (the packages write them with json.dumps), read whole (up to
MAX_DOCUMENT_BYTES). Every refusal is one sentence: the file, the line or record, what is wrong.

A bad record (a line that is not UTF-8, holds a NUL byte, is nested too deeply, is too long or does not parse as its
format's record) either stops the read (`read_trace` without `skipped`: the first one is raised) or is skipped and
its sentence appended to `skipped`, keeping the rest. What is kept then: in a log or JSONL file every other line; in a
verifiers rollout the steps before the bad one (the rollout's later steps follow from it); in a trajectory document
the requests before the bad step (every later prompt holds it). A file that is not text in one encoding as a whole
(a trajectory document with a bad byte, UTF-16 that does not decode) is refused. UTF-8 with or without a byte-order
mark is read, and UTF-16 / UTF-32 with one.
"""

from __future__ import annotations

import ast
import codecs
import io
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from engine.traces.records import TraceFormatError, TraceRequest

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A log or JSONL line longer than this is skipped unread (a vLLM log line with a 128k-token prompt is a few MB).
MAX_LINE_BYTES = 64 << 20
# A trajectory document is parsed whole: one larger than this is refused before it is read.
MAX_DOCUMENT_BYTES = 256 << 20
TOO_DEEP = "nested too deeply to read (over Python's recursion limit)"

# What a reader does with a bad record: raise it (the strict default) or note it and go on (read_trace's `skipped`).
Skip = Callable[[TraceFormatError], None]


def _raise(err: TraceFormatError) -> None:
    raise err


@dataclass(frozen=True)
class TraceFormat:
    name: str
    title: str
    detect: Callable[[str, Any], bool]  # (first non-empty line, the first JSON value or None) -> is it this format
    read: Callable[[str, Iterable[str], Skip], Iterator[TraceRequest]]  # (file name, lines, skip) -> requests
    streamed: bool  # read line by line (a bad line is one record); else one JSON document read whole


def _fail(name: str, where: str, problem: str) -> TraceFormatError:
    return TraceFormatError(f"{name}: {where}: {problem}", where=where)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


# One int object per distinct token id: a JSON parser makes a new one (28 bytes) for every id it reads, and the
# sequences a long analysis keeps would hold millions; shared, each id costs the tuple's 8-byte slot. Bounded (about
# 10 MB): a vocabulary's frequent ids come first; past the bound an id is shared only if it is already there.
_ID_OBJECTS: dict[int, int] = {}
_ID_OBJECTS_MAX = 1 << 17


def _ids(value: Any, name: str, where: str, field: str, hint: str = "") -> tuple[int, ...]:
    if isinstance(value, list) and "..." in value:
        raise _fail(name, where, f"{field} was cut short (a \"...\" in the list){hint}")
    if not _int_list(value):
        raise _fail(name, where, f"{field} is not a list of token ids (got {type(value).__name__})")
    if len(_ID_OBJECTS) < _ID_OBJECTS_MAX:
        return tuple(map(_ID_OBJECTS.setdefault, value, value))
    return tuple(map(_ID_OBJECTS.get, value, value))


def _json_line(name: str, line_no: int, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise _fail(name, f"line {line_no}", f"not valid JSON ({err.msg}, column {err.colno})") from None
    except RecursionError:
        raise _fail(name, f"line {line_no}", TOO_DEEP) from None


# ---------------------------------------------------------------------------------------------------------------
# vLLM 0.33.0 request logger


_VLLM_HEADER = re.compile(r"^.*?\((?P<process>[^()]*) pid=\d+\) (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[(?P<file>[^\]]+):(?P<line>\d+)\] (?P<message>.*)$")
_VLLM_DETAILS = re.compile(r"^Request (?P<id>\S+) details: prompt: (?P<prompt>.*), prompt_token_ids: "
                           r"(?P<ids>\[[0-9, ]*\]|None), prompt_embeds shape: .*\.$")
_VLLM_BODY = re.compile(r"^Request (?P<id>\S+) JSON body: (?P<body>.*)$")
_VLLM_OUT_IDS = re.compile(r"^Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:delta|complete)\))? "
                           r"details: output_token_ids: (?P<ids>\[[0-9, ]*\]|None)$")
_VLLM_OUT_TEXT = re.compile(r"^Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:delta|complete)\))?: "
                            r"output: (?P<output>.*), finish_reason: (?P<finish>\S+)$")
_VLLM_DEBUG_HINT = ("; vLLM logs token ids only with --enable-log-requests --enable-log-outputs at --log-level "
                    "DEBUG")


def _vllm_line(line: str) -> re.Match | None:
    return _VLLM_HEADER.match(_ANSI.sub("", line.rstrip("\r\n")))


def _detect_vllm(first: str, _: Any) -> bool:
    return _vllm_line(first) is not None


def _python_literal(name: str, where: str, text: str, what: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        raise _fail(name, where, f"{what} is not a Python string literal as vLLM's %r writes it") from None


def _read_vllm(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    bodies: dict[str, dict] = {}  # JSON bodies logged before their request's details, by request id
    pending: dict[str, dict[str, Any]] = {}  # requests whose output has not been logged yet
    seen_records = False
    for line_no, line in enumerate(lines, 1):
        header = _vllm_line(line)
        if header is None or not header["file"].endswith("request_logger.py"):
            continue
        seen_records = seen_records or header["message"].startswith(("Received request ", "Request ",
                                                                       "Generated response "))
        try:
            yield from _vllm_record(name, line_no, header["message"], bodies, pending)
        except TraceFormatError as err:
            skip(err)
    for request_id, entry in pending.items():
        if "completion_ids" in entry:  # an output logged with ids, whose text line is missing (an empty reply)
            yield _vllm_request(request_id, entry, None, None)
    if not seen_records:
        raise TraceFormatError(f"{name} has no vLLM request-logger records{_VLLM_DEBUG_HINT}")


def _vllm_record(name: str, line_no: int, message: str, bodies: dict[str, dict],
                 pending: dict[str, dict[str, Any]]) -> Iterator[TraceRequest]:
    """One request-logger line: kept in `bodies` / `pending` until its request's output, which yields it."""
    where = f"line {line_no}"
    if message.startswith("Received request "):
        return
    if (match := _VLLM_BODY.match(message)) is not None:
        try:
            body = json.loads(match["body"])
        except json.JSONDecodeError as err:
            raise _fail(name, where, f"the JSON body of request {match['id']} is not valid JSON ({err.msg}, "
                        f"column {err.colno}); was it cut by --max-log-len?") from None
        except RecursionError:
            raise _fail(name, where, f"the JSON body of request {match['id']} is {TOO_DEEP}") from None
        bodies[match["id"]] = body if isinstance(body, dict) else {}
        return
    if (match := _VLLM_DETAILS.match(message)) is not None:
        request_id = match["id"]
        if match["ids"] == "None":
            raise _fail(name, where, f"request {request_id} was logged without prompt_token_ids")
        prompt = _python_literal(name, where, match["prompt"], f"the prompt of request {request_id}")
        base = request_id.removeprefix("chatcmpl-").removeprefix("cmpl-")
        pending[request_id] = {"line": line_no, "prompt_ids": tuple(json.loads(match["ids"])),
                               "prompt": prompt if isinstance(prompt, str) else None,
                               "body": bodies.pop(base, None) or bodies.pop(request_id, None)}
        return
    if (match := _VLLM_OUT_IDS.match(message)) is not None:
        if "delta" in (match["stream"] or ""):
            return
        entry = pending.get(match["id"])
        if entry is None:
            return  # its request was logged before this file starts (a rotated log)
        if match["ids"] == "None":
            raise _fail(name, where, f"the output of request {match['id']} was logged without output_token_ids")
        entry["completion_ids"] = tuple(json.loads(match["ids"]))
        return
    if (match := _VLLM_OUT_TEXT.match(message)) is not None:
        if "delta" in (match["stream"] or ""):
            return
        entry = pending.pop(match["id"], None)
        if entry is None:
            return
        output = _python_literal(name, where, match["output"], f"the output of request {match['id']}")
        yield _vllm_request(match["id"], entry, output if isinstance(output, str) else None, match["finish"])
        return
    if message.startswith(("Request ", "Generated response ")):
        raise _fail(name, where, f"a vLLM request-logger record that does not parse: {message[:80]!r}")


def _vllm_request(request_id: str, entry: dict[str, Any], output: str | None, finish: str | None) -> TraceRequest:
    body = entry.get("body") or {}
    return TraceRequest(
        format="vllm-log", request_id=request_id, where=f"line {entry['line']}", order=entry["line"],
        session=conversation_id(body),
        prompt_ids=entry["prompt_ids"], completion_ids=entry.get("completion_ids"), prompt_text=entry["prompt"],
        completion_text=output, messages=_messages(body.get("messages")), tools=_tools(body.get("tools")),
        model=body.get("model"), finish_reason=finish, chat_template_kwargs=body.get("chat_template_kwargs"),
    )


# ---------------------------------------------------------------------------------------------------------------
# SGLang 0.5.23 request logger, json format


_SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?P<json>\{.*\})\s*$")
_SGLANG_CUT = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \{.*\"event\": \"request\.")  # a record without its end
_SGLANG_EVENTS = ("request.received", "request.received.openai", "request.finished")
_SGLANG_HINT = "; SGLang logs whole id lists only at --log-requests-level 3"


def _sglang_session(obj: dict) -> str | None:
    """GenerateReqInput's own session: session_id, conversation_id, or the session API's session_params.id
    (io_struct.py:183, 274, 309 at 0.5.23)."""
    params = obj.get("session_params")
    for value in (obj.get("session_id"), obj.get("conversation_id"), params.get("id") if isinstance(params, dict)
                  else None):
        if isinstance(value, str) and value:
            return value
    return None


def _detect_sglang(first: str, _: Any) -> bool:
    match = _SGLANG_LINE.match(first)
    return bool(match) and '"event": "request.' in match["json"]


def _read_sglang(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    openai_bodies: dict[str, dict] = {}  # the OpenAI request as received, by the rid the client gave
    received: dict[str, int] = {}  # rid -> the line its request.received record is on
    seen = False
    for line_no, line in enumerate(lines, 1):
        match = _SGLANG_LINE.match(line)
        if match is None:
            if _SGLANG_CUT.match(line):
                seen = True
                skip(_fail(name, f"line {line_no}", "a request-logger record cut short (it does not end with })"))
            continue
        seen = seen or any(f'"event": "{event}"' in match["json"] for event in _SGLANG_EVENTS)
        try:
            yield from _sglang_record(name, line_no, match["json"], openai_bodies, received)
        except TraceFormatError as err:
            skip(err)
    if not seen:
        raise TraceFormatError(f"{name} has no SGLang request.finished records (run with --log-requests "
                               "--log-requests-level 3 --log-requests-format json)")


def _sglang_record(name: str, line_no: int, text: str, openai_bodies: dict[str, dict],
                   received: dict[str, int]) -> Iterator[TraceRequest]:
    """One request-logger line: the request's OpenAI body and receipt are kept until request.finished yields it."""
    where = f"line {line_no}"
    record = _json_line(name, line_no, text)
    event = record.get("event") if isinstance(record, dict) else None
    if event not in _SGLANG_EVENTS:
        return
    obj = record.get("obj")
    if not isinstance(obj, dict):
        raise _fail(name, where, f"the {event} record has no obj")
    if event == "request.received.openai":
        if isinstance(obj.get("rid"), str):
            openai_bodies[obj["rid"]] = obj
        return
    if event == "request.received":
        if isinstance(record.get("rid"), str):
            received[record["rid"]] = line_no
        return
    rid = record.get("rid")
    out = record.get("out")
    if not isinstance(rid, str) or not isinstance(out, dict):
        raise _fail(name, where, "the request.finished record lacks rid or out")
    if "input_ids" not in obj or "output_ids" not in out:
        raise _fail(name, where, f"request {rid} was logged without input_ids / output_ids{_SGLANG_HINT}")
    prompt_ids = _ids(obj["input_ids"], name, where, f"obj.input_ids of request {rid}", _SGLANG_HINT)
    completion_ids = _ids(out["output_ids"], name, where, f"out.output_ids of request {rid}", _SGLANG_HINT)
    meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
    body = openai_bodies.pop(rid, {})
    finish = meta.get("finish_reason")
    yield TraceRequest(
        format="sglang-log", request_id=rid, where=where, order=received.pop(rid, line_no),
        session=_sglang_session(obj) or conversation_id(body),
        prompt_ids=prompt_ids, completion_ids=completion_ids,
        prompt_text=obj.get("text") if isinstance(obj.get("text"), str) else None,
        completion_text=out.get("text") if isinstance(out.get("text"), str) else None,
        messages=_messages(body.get("messages")), tools=_tools(body.get("tools")), model=body.get("model"),
        finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
        cached_tokens=meta.get("cached_tokens") if isinstance(meta.get("cached_tokens"), int) else None,
        chat_template_kwargs=body.get("chat_template_kwargs"),
    )


# ---------------------------------------------------------------------------------------------------------------
# verifiers results.jsonl


def _detect_verifiers(_: str, value: Any) -> bool:
    return _is_rollout(value)


def _read_verifiers(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    any_rollout = False
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        any_rollout = True
        try:
            yield from _verifiers_line(name, line_no, line)
        except TraceFormatError as err:
            skip(err)  # the rollout's steps before the bad one are kept: its later prompts follow from it
    if not any_rollout:
        raise TraceFormatError(f"{name} holds no verifiers rollout")


def _is_rollout(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("trajectory"), list) and "history" not in value


_ROLLOUT_COLUMNS = frozenset({"example_id", "prompt", "completion"})  # what verifiers saves of every rollout


def _detect_verifiers_list(_: str, value: Any) -> bool:
    first = value[0] if isinstance(value, list) and value else None
    return _is_rollout(first) or (isinstance(first, dict) and _ROLLOUT_COLUMNS <= first.keys()
                                  and "history" not in first)


def _read_verifiers_list(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    """Rollouts saved as one JSON list: each element as a results.jsonl line is read."""
    rollouts = _whole_json(name, lines, list)
    if not rollouts:
        raise TraceFormatError(f"{name} holds no verifiers rollout")
    for i, rollout in enumerate(rollouts):
        try:
            yield from _verifiers_rollout(name, f"rollout [{i}]", f"rollout [{i}]", rollout, "verifiers-json")
        except TraceFormatError as err:
            skip(err)  # as in results.jsonl: the rollout's steps before the bad one, and every other rollout


def _verifiers_line(name: str, line_no: int, line: str) -> Iterator[TraceRequest]:
    """One results.jsonl line: a rollout."""
    if line.lstrip().startswith("["):
        raise _fail(name, f"line {line_no}", "a JSON list, not one rollout a line: rollouts saved as one JSON list "
                    "are read as --format verifiers-json")
    yield from _verifiers_rollout(name, f"line {line_no}", f"rollout on line {line_no}",
                                  _json_line(name, line_no, line))


def _verifiers_rollout(name: str, at: str, fallback_session: str, rollout: Any,
                       trace_format: str = "verifiers") -> Iterator[TraceRequest]:
    """One rollout (`at`: where it is in the file), one request per trajectory step."""
    if not isinstance(rollout, dict) or not isinstance(rollout.get("trajectory"), list):
        raise _fail(name, at, "a rollout without a trajectory list (save it with the trajectory state column)")
    tools = _tools(rollout.get("tool_defs"))
    for i, step in enumerate(rollout["trajectory"]):
        where = f"{at}, trajectory[{i}]"
        if not isinstance(step, dict):
            raise _fail(name, where, "a trajectory step is not an object")
        tokens = step.get("tokens")
        prompt_ids = completion_ids = None
        if tokens is not None:
            if not isinstance(tokens, dict):
                raise _fail(name, where, "tokens is not an object")
            prompt_ids = _ids(tokens.get("prompt_ids"), name, where, "tokens.prompt_ids")
            completion_ids = _ids(tokens.get("completion_ids"), name, where, "tokens.completion_ids")
        completion = step.get("completion")
        reply = completion[0] if isinstance(completion, list) and completion and \
            isinstance(completion[0], dict) else None
        session = step.get("trajectory_id") or rollout.get("trajectory_id") or fallback_session
        yield TraceRequest(
            format=trace_format, request_id=f"{session}#{i}", where=where, session=str(session),
            prompt_ids=prompt_ids, completion_ids=completion_ids,
            messages=_messages(step.get("prompt")), tools=tools, response_message=reply,
            finish_reason=None,
        )


# ---------------------------------------------------------------------------------------------------------------
# ATIF v1.4+ (atif 1.8.0)


def _detect_atif(_: str, value: Any) -> bool:
    return isinstance(value, dict) and str(value.get("schema_version", "")).startswith("ATIF-v")


def _read_atif(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    document = _whole_json(name, lines)
    version = str(document.get("schema_version", ""))
    steps = document.get("steps")
    if not isinstance(steps, list):
        raise _fail(name, "steps", "an ATIF trajectory needs a steps list")
    agent = document.get("agent") if isinstance(document.get("agent"), dict) else {}
    tools = _tools(agent.get("tool_definitions"))
    session = document.get("session_id") or document.get("trajectory_id") or Path(name).stem
    messages: list[dict] = []
    try:
        for i, step in enumerate(steps):
            where = f"steps[{i}]"
            if not isinstance(step, dict) or step.get("source") not in ("system", "user", "agent"):
                raise _fail(name, where, "a step needs source system, user or agent")
            if step.get("step_id") != i + 1:
                raise _fail(name, where, f"step_id={step.get('step_id')!r} is not sequential; expected {i + 1}")
            text = _text(step.get("message"))
            if step["source"] != "agent":
                messages.append({"role": step["source"], "content": text})
                continue
            metrics = step.get("metrics") if isinstance(step.get("metrics"), dict) else {}
            prompt_ids = completion_ids = None
            if metrics.get("prompt_token_ids") is not None or metrics.get("completion_token_ids") is not None:
                prompt_ids = _ids(metrics.get("prompt_token_ids"), name, where, "metrics.prompt_token_ids",
                                  f" ({version}; prompt_token_ids are v1.4+)")
                completion_ids = _ids(metrics.get("completion_token_ids"), name, where, "metrics.completion_token_ids")
            reply: dict[str, Any] = {"role": "assistant", "content": text}
            if step.get("reasoning_content") is not None:
                reply["reasoning_content"] = step["reasoning_content"]
            calls = step.get("tool_calls") or []
            if calls:
                try:
                    reply["tool_calls"] = [{"id": c["tool_call_id"], "type": "function",
                                            "function": {"name": c["function_name"],
                                                         "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                                           for c in calls]
                except (KeyError, TypeError):
                    raise _fail(name, where, "a tool call needs tool_call_id, function_name and arguments") from None
            if step.get("llm_call_count") != 0:
                cached = metrics.get("cached_tokens")
                yield TraceRequest(
                    format="atif", request_id=f"{session}#{step['step_id']}", where=where, session=str(session),
                    prompt_ids=prompt_ids, completion_ids=completion_ids, messages=tuple(messages), tools=tools,
                    response_message=reply, model=step.get("model_name") or agent.get("model_name"),
                    cached_tokens=cached if isinstance(cached, int) else None,
                )
            messages.append(reply)
            observation = step.get("observation") if isinstance(step.get("observation"), dict) else {}
            for result in observation.get("results") or []:
                if isinstance(result, dict):
                    tool = {"role": "tool", "content": _text(result.get("content"))}
                    if result.get("source_call_id"):
                        tool["tool_call_id"] = result["source_call_id"]
                    messages.append(tool)
    except TraceFormatError as err:
        skip(err)  # the requests before the bad record are kept: every later prompt holds it



# ---------------------------------------------------------------------------------------------------------------
# OpenAI-style request/response JSONL


def _detect_openai(_: str, value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("request"), dict) and "response" in value


def _read_openai(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    count = 0
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        count += 1
        try:
            request = openai_record(name, line_no, line)
        except TraceFormatError as err:
            skip(err)
            continue
        if request is not None:
            yield request
    if not count:
        raise TraceFormatError(f"{name} holds no request/response line")


def openai_record(name: str, line_no: int, line: str) -> TraceRequest | None:
    """One JSONL line: a request and its response; None for an exchange `python -m engine watch` recorded whole but
    marked cut (`"watch": {"complete": false}`: the upstream failed or answered an error, the client went away), which
    has no completion to analyse."""
    record = _json_line(name, line_no, line)
    where = f"line {line_no}"
    if isinstance(record, dict) and isinstance(record.get("watch"), dict) and record["watch"].get("complete") is False:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("request"), dict) or \
            not isinstance(record.get("response"), dict):
        raise _fail(name, where, "each line needs a request object and a response object")
    request, response = record["request"], record["response"]
    if not isinstance(request.get("messages"), list):
        raise _fail(name, where, "request.messages is not a list")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _fail(name, where, "response.choices is empty or not a list")
    choice = choices[0]
    prompt_ids = completion_ids = None
    if response.get("prompt_token_ids") is not None:
        prompt_ids = _ids(response["prompt_token_ids"], name, where, "response.prompt_token_ids")
        completion_ids = _ids(choice.get("token_ids"), name, where, "response.choices[0].token_ids")
    session = conversation_id(record) or conversation_id(request)
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    return TraceRequest(
        format="openai-jsonl", request_id=str(response.get("id") or f"line {line_no}"), where=where,
        session=session, prompt_ids=prompt_ids, completion_ids=completion_ids,
        messages=_messages(request["messages"]), tools=_tools(request.get("tools")),
        response_message=choice.get("message") if isinstance(choice.get("message"), dict) else None,
        model=request.get("model"), finish_reason=choice.get("finish_reason"),
        cached_tokens=details.get("cached_tokens") if isinstance(details.get("cached_tokens"), int) else None,
        chat_template_kwargs=request.get("chat_template_kwargs"),
    )


# ---------------------------------------------------------------------------------------------------------------
# mini-swe-agent and SWE-agent trajectories


def _detect_mini(_: str, value: Any) -> bool:
    return isinstance(value, dict) and str(value.get("trajectory_format", "")).startswith("mini-swe-agent")


def _detect_swe(_: str, value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("history"), list) and "trajectory" in value


def _read_mini(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    document = _whole_json(name, lines)
    messages = document.get("messages")
    if not isinstance(messages, list):
        raise _fail(name, "messages", "a mini-swe-agent trajectory needs a messages list")
    info = document.get("info") if isinstance(document.get("info"), dict) else {}
    session = str(info.get("instance_id") or Path(name).stem)
    sent: list[dict] = []
    try:
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _fail(name, where, "a message needs a role")
            if message["role"] == "exit":
                continue
            clean = {k: v for k, v in message.items() if k != "extra" and v is not None}
            if message["role"] == "assistant":
                response = (message.get("extra") or {}).get("response") if isinstance(message.get("extra"), dict) \
                    else None
                prompt_ids = completion_ids = None
                if isinstance(response, dict) and response.get("prompt_token_ids") is not None:
                    prompt_ids = _ids(response["prompt_token_ids"], name, where, "extra.response.prompt_token_ids")
                    choices = response.get("choices") or [{}]
                    completion_ids = _ids(choices[0].get("token_ids") if isinstance(choices[0], dict) else None, name,
                                          where, "extra.response.choices[0].token_ids")
                yield TraceRequest(
                    format="mini-swe-agent", request_id=f"{session}#{i}", where=where, session=session,
                    prompt_ids=prompt_ids, completion_ids=completion_ids, messages=tuple(sent), tools=None,
                    response_message=clean, model=response.get("model") if isinstance(response, dict) else None,
                )
            sent.append(clean)
    except TraceFormatError as err:
        skip(err)  # the requests before the bad record are kept: every later prompt holds it



def _read_swe(name: str, lines: Iterable[str], skip: Skip = _raise) -> Iterator[TraceRequest]:
    document = _whole_json(name, lines)
    history = document.get("history")
    if not isinstance(history, list):
        raise _fail(name, "history", "a SWE-agent trajectory needs a history list")
    session = Path(name).stem
    sent: list[dict] = []
    try:
        for i, entry in enumerate(history):
            where = f"history[{i}]"
            if not isinstance(entry, dict) or entry.get("role") not in ("system", "user", "assistant", "tool"):
                raise _fail(name, where, "a history entry needs role system, user, assistant or tool")
            message: dict[str, Any] = {"role": entry["role"], "content": _text(entry.get("content"))}
            if entry.get("tool_calls"):
                message["tool_calls"] = entry["tool_calls"]
            ids = entry.get("tool_call_ids")
            if entry["role"] == "tool" and isinstance(ids, list) and ids:
                message["tool_call_id"] = ids[0]
            if entry["role"] == "assistant":
                yield TraceRequest(format="swe-agent", request_id=f"{session}#{i}", where=where, session=session,
                                   messages=tuple(sent), response_message=message)
            sent.append(message)
    except TraceFormatError as err:
        skip(err)  # the requests before the bad record are kept: every later prompt holds it



# ---------------------------------------------------------------------------------------------------------------
# Shared


def _whole_json(name: str, lines: Iterable[str], kind: type = dict) -> Any:
    """The file as one JSON document: a trajectory (an object) or a list of rollouts (`kind=list`)."""
    text = "".join(lines)
    what = "the trajectory" if kind is dict else "the rollout list"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise _fail(name, f"line {err.lineno}", f"not valid JSON ({err.msg}, column {err.colno})") from None
    except RecursionError:
        raise _fail(name, "line 1", f"{what} is {TOO_DEEP}") from None
    if not isinstance(document, kind):
        raise _fail(name, "line 1", f"{what} is not a JSON {'object' if kind is dict else 'list'}")
    return document


def conversation_id(record: Any) -> str | None:
    """What a request body or a JSONL record names its conversation by: `session_id` or `conversation_id`, at its top
    level or in `metadata`. `user` is not one: it names who asked, and one user holds many conversations."""
    if not isinstance(record, dict):
        return None
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    for value in (record.get("session_id"), record.get("conversation_id"), metadata.get("session_id"),
                  metadata.get("conversation_id")):
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _messages(value: Any) -> tuple[dict, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(m for m in value if isinstance(m, dict))


def _tools(value: Any) -> tuple[dict, ...] | None:
    if not isinstance(value, list) or not value:
        return None
    # verifiers' Tool is {name, description, parameters}; the templates take OpenAI's {type, function}.
    return tuple(t if "function" in t else {"type": "function", "function": t} for t in value if isinstance(t, dict))


FORMATS: dict[str, TraceFormat] = {f.name: f for f in (
    TraceFormat("vllm-log", "vLLM request log (0.33.0)", _detect_vllm, _read_vllm, streamed=True),
    TraceFormat("sglang-log", "SGLang request log, json (0.5.23)", _detect_sglang, _read_sglang, streamed=True),
    TraceFormat("atif", "ATIF trajectory (v1.4+)", _detect_atif, _read_atif, streamed=False),
    TraceFormat("mini-swe-agent", "mini-swe-agent trajectory", _detect_mini, _read_mini, streamed=False),
    TraceFormat("swe-agent", "SWE-agent trajectory", _detect_swe, _read_swe, streamed=False),
    TraceFormat("verifiers", "verifiers / prime-rl rollouts (results.jsonl)", _detect_verifiers, _read_verifiers,
                streamed=True),
    TraceFormat("verifiers-json", "verifiers / prime-rl rollouts saved as one JSON list", _detect_verifiers_list,
                _read_verifiers_list, streamed=False),
    TraceFormat("openai-jsonl", "OpenAI-style request/response JSONL", _detect_openai, _read_openai, streamed=True),
)}


def _first_value(head: str) -> Any:
    """The first JSON value of the file's head: its first line (JSONL), else the whole head (a document); for a
    list, the list of its first element."""
    first = next((line for line in head.splitlines() if line.strip()), "")
    if head.lstrip().startswith("["):
        return _first_element(head.lstrip())
    for text in (first, head):
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            continue
    return _document_keys(head)


def _first_element(head: str) -> list | None:
    """A JSON list's first element, as a one-element list; when the head cuts it off, the keys its first object
    holds (at any depth: enough to tell a rollout)."""
    at = len(head) - len(head[1:].lstrip())
    try:
        element, _ = json.JSONDecoder().raw_decode(head, at)
        return [element]
    except (json.JSONDecodeError, RecursionError):
        pass
    if not head[at:].startswith("{"):
        return None
    keys = set(re.findall(r'"([A-Za-z_]+)":', head))
    return [{k: [] for k in keys}] if keys else None


def _document_keys(head: str) -> dict | None:
    # A large document cut off at the head: its top-level keys still show which format it is.
    keys = re.findall(r'^\s{0,2}"([A-Za-z_]+)":\s*("[^"]*")?', head, flags=re.MULTILINE)
    if not keys:
        return None
    return {k: (json.loads(v) if v else []) for k, v in keys}


def detect_format(name: str, head: str) -> str:
    """The format of a file from its first bytes (up to 1 MB); one sentence when none fits."""
    first = next((line for line in head.splitlines() if line.strip()), "")
    if not first:
        raise TraceFormatError(f"{name} is empty")
    value = _first_value(head)
    for trace_format in FORMATS.values():
        if trace_format.detect(first, value):
            return trace_format.name
    if "\x00" in first:
        raise TraceFormatError(f"{name}: line 1 holds NUL bytes: it is a binary file, or UTF-16 without a byte-order "
                               "mark (save it as UTF-8)")
    raise TraceFormatError(f"{name}: line 1 is not any trace format read here ({', '.join(FORMATS)}): "
                           f"{first[:60]!r}")


HEAD_BYTES = 1 << 20
# Byte-order marks: the encoding a file declares by its first bytes (UTF-32's first, it starts as UTF-16 LE's does).
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _encoding(head: bytes) -> str:
    return next((encoding for bom, encoding in _BOMS if head.startswith(bom)), "utf-8")


def _too_long() -> str:
    cap = f"{MAX_LINE_BYTES >> 20} MB" if MAX_LINE_BYTES >= 1 << 20 else f"{MAX_LINE_BYTES:,} bytes"
    return f"the line is longer than the {cap} a trace line may hold; it was not read"


def _text_lines(name: str, raw: BinaryIO, encoding: str, skip: Skip) -> Iterator[str]:
    """The file's lines as text, each at most MAX_LINE_BYTES, read one at a time. A line that is too long, holds a NUL
    byte or is not valid in the encoding goes to `skip` and is handed on as an empty line (so that the lines after it
    keep their numbers)."""
    if encoding not in ("utf-8", "utf-8-sig"):
        # UTF-16 / UTF-32 (with a byte-order mark): decoded as a stream; a byte that does not decode ends the read
        text = io.TextIOWrapper(raw, encoding=encoding, errors="strict", newline="")
        line_no = 0
        try:
            while line := text.readline(MAX_LINE_BYTES):
                line_no += 1
                if len(line) < MAX_LINE_BYTES or line.endswith("\n"):
                    yield line
                    continue
                while line and not line.endswith("\n"):  # the rest of the line, unread
                    line = text.readline(1 << 20)
                skip(_fail(name, f"line {line_no}", _too_long()))
                yield "\n"
        except UnicodeDecodeError as err:
            raise _fail(name, f"line {line_no + 1}", f"is not {encoding.upper()} ({err.reason})") from None
        return
    if encoding == "utf-8-sig":
        raw.read(len(codecs.BOM_UTF8))
    line_no = 0
    while data := raw.readline(MAX_LINE_BYTES + 1):
        line_no += 1
        problem = None
        if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
            while data and not data.endswith(b"\n"):  # the rest of the line, unread
                data = raw.readline(1 << 20)
            problem = _too_long()
        elif b"\x00" in data:
            problem = f"a NUL byte at byte offset {data.index(0)} of the line: it is not text"
        else:
            try:
                yield data.decode("utf-8")
                continue
            except UnicodeDecodeError as err:
                problem = f"not UTF-8 text: byte 0x{data[err.start]:02x} at byte offset {err.start} of the line"
        skip(_fail(name, f"line {line_no}", problem))
        yield "\n"


def read_trace(path: str | Path, trace_format: str | None = None, *, name: str | None = None,
               skipped: list[TraceFormatError] | None = None) -> Iterator[TraceRequest]:
    """Every request in the file, in the order the format records them (streamed for the log formats).

    Without `skipped` the first bad record is raised; with it, each bad record's sentence is appended there and the
    rest of the file is read (the module's docstring says what is kept, per format)."""
    path = Path(path)
    label = name or path.name
    try:
        with open(path, "rb") as raw:
            head_bytes = raw.read(HEAD_BYTES)
    except OSError as err:
        raise TraceFormatError(f"{label} cannot be read: {err.strerror or err}") from None
    encoding = _encoding(head_bytes)
    head = head_bytes.decode(encoding, errors="replace")
    chosen = trace_format or detect_format(label, head.removeprefix("\ufeff"))
    if chosen not in FORMATS:
        raise TraceFormatError(f"unknown trace format {chosen!r}; known: {', '.join(FORMATS)}")
    reader = FORMATS[chosen]
    if not reader.streamed:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise TraceFormatError(f"{label} is a {chosen} document of {size >> 20} MB, over the "
                                   f"{MAX_DOCUMENT_BYTES >> 20} MB one may have to be read whole")
    skip_record: Skip = skipped.append if skipped is not None else _raise
    # A trajectory document is one JSON value: a line of it that is not text spoils it whole.
    skip_line = skip_record if reader.streamed else _raise
    with open(path, "rb") as raw:
        yield from reader.read(label, _text_lines(label, raw, encoding, skip_line), skip_record)
