"""Writes the sample traces in samples/traces/ from our own simulator's sessions.

No real multi-turn trace with token ids is available offline, so each sample is one of our scripted conversations
(scenarios/*.yaml) run through our pipeline (engine/traces/pipeline.py: the engine's request side, Qwen3.5's real
template and tokenizer, the model's output written by engine/formats, the engine's parsers), then written the way
each engine's or package's own code writes its records: vLLM 0.33.0's request logger lines (its logger format, the
DEBUG records' shortened file path, %r prompts, `str(list)` ids, the pydantic JSON body), SGLang 0.5.23's json
request log (`[%Y-%m-%d %H:%M:%S] ` + `json.dumps({"timestamp", "event", ...}, ensure_ascii=False)`, every
GenerateReqInput field), verifiers' results.jsonl and the same rollouts saved as one JSON list, an ATIF 1.8
trajectory (validated by the atif package when it is installed), OpenAI-style request/response JSONL with vLLM's
return_token_ids fields, a mini-swe-agent 1.1 and a SWE-agent trajectory. The server logs interleave the sessions'
requests as a busy server logs them.

    python samples/traces/generate.py            # rewrites every sample (deterministic)
    python samples/traces/generate.py --bench    # also the benchmark traces under build/traces/ (not committed)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.formats import AssistantTurn, get_format  # noqa: E402
from engine.models import LoadedModel, load_model  # noqa: E402
from engine.scenario import Scenario, ScriptTurn, load_scenario  # noqa: E402
from engine.serving.bridge import sampled_completion_ids  # noqa: E402
from engine.traces.pipeline import (  # noqa: E402
    completion_of,
    parse_completion,
    render_request,
    returned_message,
    served_by,
    template_kwargs,
)

OUT = Path(__file__).resolve().parent
MODEL = "qwen3.5"
# holds; template drops reasoning at the next user turn; vLLM's parser trims a parameter; the client drops
# reasoning (the replay does not reproduce it); a sampled non-canonical tokenization.
SCENARIOS = ("tool-call", "next-user-turn", "args-serialization", "client-drops-reasoning", "noncanonical-tokens")
START = datetime(2026, 12, 1, 9, 30, 0)


@dataclass
class Request:
    session: str
    number: int
    messages: list[dict]
    tools: list[dict] | None
    prompt_text: str
    prompt_ids: tuple[int, ...]
    completion_text: str
    completion_ids: tuple[int, ...]
    reply: dict  # the message the engine returned
    finish_reason: str
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CLOSING = AssistantTurn(reasoning="The result answers the question.", content="Done: see the result above.")


def as_session(scenario: Scenario, n: int) -> Scenario:
    """A scenario as one user's session: its first question names the ticket (users ask different things, so
    sessions part after the shared system prompt), and a trailing user or tool message gets the model's answer."""
    turns = list(scenario.turns)
    first = next(i for i, t in enumerate(turns) if t.role == "user")
    turns[first] = ScriptTurn("user", text=f"Ticket #{n}: {turns[first].text}")
    if turns[-1].role != "assistant":
        turns.append(ScriptTurn("assistant", assistant=CLOSING))
    return replace(scenario, turns=tuple(turns))


def run_session(model: LoadedModel, scenario: Scenario, engine: str, session: str) -> list[Request]:
    """The scenario's requests as the client sends them through `engine`."""
    served = served_by(engine)
    kwargs = template_kwargs(model, scenario.kwargs)
    fmt = get_format(model.spec.family)
    stop = model.spec.stop_tokens[0]
    tools = scenario.tools
    history: list[dict] = [{"role": "system", "content": scenario.system}] if scenario.system else []
    call_ids: list[str] = []
    cursor = calls = 0
    requests: list[Request] = []
    for turn in scenario.turns:
        if turn.role in ("user", "tool"):
            message: dict[str, Any] = {"role": turn.role, "content": turn.text}
            if turn.role == "tool":
                message["tool_call_id"] = call_ids[cursor] if cursor < len(call_ids) else "call_missing"
                cursor += 1
            history.append(message)
            continue
        assert turn.assistant is not None
        prompt, _, _ = render_request(model, served, history, tools, kwargs)
        completion = fmt.write(turn.assistant, stop)
        ids = sampled_completion_ids(model, completion, turn.noncanonical_tokens)
        assert ids is not None and model.tokenizer is not None
        parsed = parse_completion(model, served, completion_of(model, completion.text), tools, kwargs, calls)
        spec_ids = [c.call_id or f"call_{calls + i}" for i, c in enumerate(turn.assistant.tool_calls)]
        reply = returned_message(parsed, spec_ids, calls)
        call_ids = [c["id"] for c in reply.get("tool_calls", [])]
        cursor, calls = 0, calls + len(call_ids)
        requests.append(Request(session, len(requests) + 1, [dict(m) for m in history], tools, prompt.text,
                                model.tokenizer.encode(prompt.text).ids, completion.text, tuple(ids), reply,
                                "tool_calls" if call_ids else ("length" if completion.truncated else "stop")))
        sent = dict(reply)
        if not scenario.client.get("send_reasoning", True):
            sent.pop("reasoning_content", None)
        history.append(sent)
    return requests


def sessions(model: LoadedModel, engine: str, rng: random.Random) -> list[list[Request]]:
    out = []
    for n, scenario_id in enumerate(SCENARIOS, start=1):
        requests = run_session(model, as_session(load_scenario(scenario_id), n), engine, f"{scenario_id}-{n}")
        for r in requests:
            r.request_id = f"{rng.getrandbits(64):016x}"
        out.append(requests)
    return out


def interleaved(all_sessions: list[list[Request]]) -> list[tuple[str, Request]]:
    """Events as a busy server logs them: every session's request k arrives before any output k, outputs in
    another order, then request k+1 of each session that continues."""
    events: list[tuple[str, Request]] = []
    depth = max(len(s) for s in all_sessions)
    for k in range(depth):
        wave = [s[k] for s in all_sessions if k < len(s)]
        events += [("request", r) for r in wave]
        events += [("output", r) for r in reversed(wave)]
    return events


# ---------------------------------------------------------------------------------------------------------------
# vLLM 0.33.0


VLLM_FILE = "entrypoints/.../utils/request_logger.py"  # NewLineFormatter.shrink_path at --log-level DEBUG
SAMPLING = ("SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, "
            "watermarking=None, top_p=0.8, top_k=20, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], "
            "thinking_token_budget=None, include_stop_str_in_output=False, ignore_eos=False, max_tokens=4096, "
            "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
            "spaces_between_special_tokens=True, structured_outputs=None, extra_args=None)")


def vllm_output_text(reply: dict) -> str:
    """What log_outputs gets (chat_completion/serving.py:1157-1177): the content, else the tool calls."""
    if reply.get("content"):
        return reply["content"]
    calls = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in reply.get("tool_calls", []))
    return f"[tool_calls: {calls}]" if calls else ""


def chat_body(r: Request, model_name: str, **more: Any) -> dict:
    body: dict[str, Any] = {"messages": r.messages, "model": model_name}
    if r.tools:
        body["tools"] = r.tools
    return {**body, **more}


def write_vllm(path: Path, all_sessions: list[list[Request]], model_name: str) -> None:
    clock = START
    lines = []

    def line(level: str, lineno: int, message: str) -> None:
        nonlocal clock
        clock += timedelta(milliseconds=137)
        stamp = clock.strftime("%m-%d %H:%M:%S")
        lines.append(f"(APIServer pid=4242) {level} {stamp} [{VLLM_FILE}:{lineno}] {message}")

    lines.append("(APIServer pid=4242) INFO 12-01 09:29:58 [api_server.py:1562] vLLM API server version 0.33.0")
    for kind, r in interleaved(all_sessions):
        rid = f"chatcmpl-{r.request_id}"
        if kind == "request":
            body = json.dumps(chat_body(r, model_name), ensure_ascii=False, separators=(",", ":"))
            line("DEBUG", 84, f"Request {r.request_id} JSON body: {body}")
            line("DEBUG", 56, f"Request {rid} details: prompt: {r.prompt_text!r}, prompt_token_ids: "
                 f"{list(r.prompt_ids)}, prompt_embeds shape: None.")
            line("INFO", 66, f"Received request {rid}: params: {SAMPLING}, lora_request: None.")
        else:
            text = vllm_output_text(r.reply)
            if not text:
                continue  # serving.py logs nothing for an answer without content or tool calls
            line("DEBUG", 112, f"Generated response {rid} details: output_token_ids: {list(r.completion_ids)}")
            line("INFO", 119, f"Generated response {rid}: output: {text!r}, finish_reason: {r.finish_reason}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# SGLang 0.5.23


# GenerateReqInput's fields and defaults at 0.5.23 (io_struct.py), in order, as _transform_data_for_logging writes
# the dataclass.
_GENERATE_FIELDS = (
    "rid session_id text input_ids input_embeds image_data video_data audio_data mm_hashes mm_content_hashes "
    "use_audio_in_video video_config sampling_params watermark return_logprob logprob_start_len top_logprobs_num "
    "token_ids_logprob return_sampling_mask sampling_logprobs_mode return_text_in_logprobs "
    "return_flat_raw_top_logprobs return_flat_raw_output_top_logprobs return_flat_raw_top_logprobs_b64 stream "
    "log_metrics return_hidden_states return_routed_experts routed_experts_start_len return_indexer_topk modalities "
    "session_params lora_path lora_id custom_logit_processor positional_embed_overrides bootstrap_host "
    "bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size routed_dp_rank data_parallel_rank "
    "disagg_prefill_dp_rank routing_key conversation_id http_worker_ipc background require_reasoning "
    "max_thinking_tokens priority extra_key no_logs custom_labels return_bytes return_entropy "
    "return_prompt_token_ids external_trace_header received_time need_wait_for_mm_inputs num_items_assigned "
    "encoder_urls max_dynamic_patch min_dynamic_patch image_max_dynamic_patch video_max_dynamic_patch images_config "
    "mm_processor_kwargs multi_item_delimiter_indices token_indices_to_pool cache_salt kv_hints").split()
_FALSE = {"use_audio_in_video", "return_text_in_logprobs", "return_flat_raw_top_logprobs",
          "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64", "stream", "return_hidden_states",
          "return_routed_experts", "return_indexer_topk", "background", "require_reasoning", "no_logs", "return_bytes",
          "return_entropy", "return_prompt_token_ids"}


def generate_obj(r: Request, rid: str, received: float) -> dict:
    obj: dict[str, Any] = {}
    for name in _GENERATE_FIELDS:
        obj[name] = False if name in _FALSE else None
    obj.update(rid=rid, input_ids=list(r.prompt_ids), log_metrics=True, routed_experts_start_len=0,
               sampling_params={"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 4096,
                                "skip_special_tokens": True}, return_logprob=False, logprob_start_len=-1,
               top_logprobs_num=0, token_ids_logprob=None, received_time=received)
    return obj


def write_sglang(path: Path, all_sessions: list[list[Request]], model_name: str, model: LoadedModel) -> None:
    clock = START
    lines = []

    def log(event: str, data: dict) -> None:
        nonlocal clock
        clock += timedelta(milliseconds=211)
        record = {"timestamp": clock.isoformat(), "event": event, **data}
        lines.append(f"[{clock.strftime('%Y-%m-%d %H:%M:%S')}] {json.dumps(record, ensure_ascii=False)}")

    stop_id = model.tokenizer.token_id(model.spec.stop_tokens[0]) if model.tokenizer else None
    for kind, r in interleaved(all_sessions):
        rid = f"{r.session}-{r.number}"  # the agent sets rid, so the OpenAI request and its result share it
        received = clock.timestamp()
        if kind == "request":
            log("request.received.openai", {"obj": chat_body(r, model_name, rid=rid, stream=False)})
            log("request.received", {"rid": rid, "obj": generate_obj(r, rid, received)})
        else:
            completion_ids = list(r.completion_ids)
            finish = ({"type": "stop", "matched": stop_id} if completion_ids and completion_ids[-1] == stop_id
                      else {"type": "length", "length": len(completion_ids)})
            meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(r.prompt_ids),
                    "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
                    "completion_tokens": len(completion_ids), "cached_tokens": 0, "e2e_latency": 0.84}
            # out.text is the detokenized output; stop ids are not part of it (skip_special_tokens)
            text = model.tokenizer.decode([i for i in completion_ids if i != stop_id]) if model.tokenizer else ""
            log("request.finished", {"rid": rid, "obj": generate_obj(r, rid, received),
                                     "out": {"text": text, "output_ids": completion_ids, "meta_info": meta}})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# verifiers, ATIF, OpenAI JSONL, mini-swe-agent, SWE-agent


def write_verifiers(path: Path, all_sessions: list[list[Request]], model_name: str, *, as_list: bool = False) -> None:
    """results.jsonl, one rollout a line; `as_list`: the same rollouts saved as one JSON list (json.dump)."""
    lines = []
    for n, requests in enumerate(all_sessions):
        trajectory_id = f"{random.Random(n).getrandbits(128):032x}"
        steps = []
        for r in requests:
            steps.append({
                "prompt": r.messages, "completion": [r.reply],
                "response": {"id": f"chatcmpl-{r.request_id}", "created": 1764581400, "model": model_name,
                             "usage": {"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(r.completion_ids),
                                       "total_tokens": len(r.prompt_ids) + len(r.completion_ids)},
                             "message": {**r.reply, "finish_reason": r.finish_reason, "is_truncated": False}},
                "tokens": {"prompt_ids": list(r.prompt_ids), "prompt_mask": [0] * len(r.prompt_ids),
                           "completion_ids": list(r.completion_ids), "completion_mask": [1] * len(r.completion_ids),
                           "completion_logprobs": [-0.25] * len(r.completion_ids), "overlong_prompt": False,
                           "is_truncated": False, "routed_experts": None},
                "reward": None, "advantage": None, "is_truncated": False, "trajectory_id": trajectory_id,
                "extras": {},
            })
        first = requests[0]
        lines.append(json.dumps({
            "example_id": n, "task": "default", "prompt": first.messages, "completion": [r.reply for r in requests],
            "answer": "", "info": {}, "reward": 0.0, "is_completed": True, "is_truncated": False,
            "metrics": {}, "stop_condition": "no_tools_called", "error": None, "trajectory": steps,
            "tool_defs": first.tools, "timing": {"start_time": 1764581400.0},
        }, ensure_ascii=False))
    if as_list:  # as json.dump writes it: one line
        path.write_text(json.dumps([json.loads(line) for line in lines], ensure_ascii=False) + "\n", encoding="utf-8")
        return
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def atif_document(requests: list[Request], model_name: str) -> dict:
    """One ATIF-v1.8 trajectory: system and user steps, then one agent step per request with its observation."""
    first = requests[0]
    steps: list[dict] = []
    seen = 0

    def add(step: dict) -> None:
        steps.append({"step_id": len(steps) + 1, **step})

    for r in requests:
        for message in r.messages[seen:]:
            if message["role"] in ("system", "user"):
                add({"source": message["role"], "message": message["content"]})
        seen = len(r.messages)
        step: dict[str, Any] = {"source": "agent", "model_name": model_name, "message": r.reply.get("content") or ""}
        if r.reply.get("reasoning_content") is not None:
            step["reasoning_content"] = r.reply["reasoning_content"]
        calls = r.reply.get("tool_calls") or []
        if calls:
            step["tool_calls"] = [{"tool_call_id": c["id"], "function_name": c["function"]["name"],
                                   "arguments": json.loads(c["function"]["arguments"])} for c in calls]
        later = next((x for x in requests if x.number == r.number + 1), None)
        results = [m for m in (later.messages[len(r.messages) + 1:] if later else []) if m["role"] == "tool"]
        if results:
            step["observation"] = {"results": [{"source_call_id": m.get("tool_call_id"), "content": m["content"]}
                                               for m in results]}
            seen += 1 + len(results)
        step["metrics"] = {"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(r.completion_ids),
                           "cached_tokens": 0, "prompt_token_ids": list(r.prompt_ids),
                           "completion_token_ids": list(r.completion_ids)}
        add(step)
    document = {"schema_version": "ATIF-v1.8", "session_id": first.session,
                "agent": {"name": "drift-sample-agent", "version": "1.0", "model_name": model_name,
                          "tool_definitions": first.tools},
                "steps": steps}
    try:
        from atif import Trajectory
    except ImportError:
        return document
    return Trajectory.model_validate(document).to_json_dict()


def write_openai(path: Path, all_sessions: list[list[Request]], model_name: str) -> None:
    lines = []
    for kind, r in interleaved(all_sessions):
        if kind != "output":
            continue
        response = {"id": f"chatcmpl-{r.request_id}", "object": "chat.completion", "created": 1764581400,
                    "model": model_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", **{k: v for k, v in r.reply.items()
                                                                                if k != "role"}},
                                 "finish_reason": r.finish_reason, "token_ids": list(r.completion_ids)}],
                    "usage": {"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(r.completion_ids),
                              "total_tokens": len(r.prompt_ids) + len(r.completion_ids)},
                    "prompt_token_ids": list(r.prompt_ids)}
        request = chat_body(r, model_name, return_token_ids=True)
        lines.append(json.dumps({"session_id": r.session, "request": request, "response": response},
                                ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def mini_document(requests: list[Request], model_name: str) -> dict:
    """mini-swe-agent 1.1: the messages list, each assistant message with its response (return_token_ids)."""
    messages: list[dict] = []
    for r in requests:
        messages.extend(r.messages[len(messages):])
        response = {"id": f"chatcmpl-{r.request_id}", "model": model_name, "object": "chat.completion",
                    "choices": [{"index": 0, "finish_reason": r.finish_reason, "message": r.reply,
                                 "token_ids": list(r.completion_ids)}],
                    "prompt_token_ids": list(r.prompt_ids)}
        messages.append({**r.reply, "extra": {"actions": [], "response": response, "cost": 0.0,
                                              "timestamp": 1764581400.0}})
    messages.append({"role": "exit", "content": "Submitted", "extra": {"exit_status": "Submitted",
                                                                         "submission": ""}})
    return {"info": {"model_stats": {"instance_cost": 0.0, "api_calls": len(requests)},
                     "config": {"agent": {}, "agent_type": "minisweagent.agents.default.DefaultAgent"},
                     "mini_version": "2.4.6", "exit_status": "Submitted", "submission": ""},
            "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}


def swe_document(requests: list[Request]) -> dict:
    """SWE-agent: `history` holds the messages (no token ids), `trajectory` one entry per step."""
    history: list[dict] = []
    trajectory = []
    for r in requests:
        for m in r.messages[len(history):]:
            entry = {"role": m["role"], "content": m["content"], "agent": "main", "message_type": "observation"}
            if m.get("tool_call_id"):
                entry["tool_call_ids"] = [m["tool_call_id"]]
            history.append(entry)
        reply = {"role": "assistant", "content": r.reply.get("content") or "", "agent": "main",
                 "message_type": "action", "thought": r.reply.get("content") or ""}
        if r.reply.get("tool_calls"):
            reply["tool_calls"] = r.reply["tool_calls"]
        history.append(reply)
        trajectory.append({"action": "", "observation": "", "response": r.reply.get("content") or "",
                           "thought": r.reply.get("content") or "", "execution_time": 0.1, "state": {},
                           "query": r.messages, "extra_info": {}})
    return {"trajectory": trajectory, "history": history, "info": {"exit_status": "submitted"}}


def write_samples(out: Path) -> None:
    model = load_model(MODEL)
    name = "Qwen/Qwen3.5-0.8B"
    vllm_sessions = sessions(model, "vllm@0.33.0", random.Random(33))
    sglang_sessions = sessions(model, "sglang@0.5.23", random.Random(523))
    write_vllm(out / "vllm-0.33.0.log", vllm_sessions, name)
    write_sglang(out / "sglang-0.5.23.log", sglang_sessions, name, model)
    write_verifiers(out / "verifiers-results.jsonl", vllm_sessions, name)
    write_verifiers(out / "verifiers-results.json", vllm_sessions, name, as_list=True)
    write_openai(out / "openai.jsonl", vllm_sessions, name)
    # One trajectory per file, as the packages save them: the reasoning-dropping session.
    chosen = vllm_sessions[1]
    (out / "atif.json").write_text(json.dumps(atif_document(chosen, name), indent=2, ensure_ascii=False) + "\n",
                                   encoding="utf-8")
    (out / "mini-swe-agent.traj.json").write_text(json.dumps(mini_document(chosen, name), indent=2) + "\n",
                                                  encoding="utf-8")
    (out / "swe-agent.traj").write_text(json.dumps(swe_document(chosen), indent=2) + "\n", encoding="utf-8")


def write_malformed(out: Path) -> None:
    """One broken file per format, each with one realistic fault, cut from the samples above."""
    bad = out / "malformed"
    bad.mkdir(exist_ok=True)
    vllm = (out / "vllm-0.33.0.log").read_text(encoding="utf-8").splitlines()
    body = next(i for i, line in enumerate(vllm) if " JSON body: " in line)
    vllm[body] = vllm[body][:400]  # --max-log-len cut the body
    (bad / "vllm.log").write_text("\n".join(vllm[:body + 3]) + "\n", encoding="utf-8")
    sglang = (out / "sglang-0.5.23.log").read_text(encoding="utf-8").splitlines()
    finished = next(i for i, line in enumerate(sglang) if '"event": "request.finished"' in line)
    head, record = sglang[finished].split("] ", 1)
    data = json.loads(record)
    ids = data["obj"]["input_ids"]
    data["obj"]["input_ids"] = ids[:4] + ["..."] + ids[-4:]  # what --log-requests-level 2 keeps of a long list
    sglang[finished] = f"{head}] {json.dumps(data, ensure_ascii=False)}"
    (bad / "sglang.log").write_text("\n".join(sglang[:finished + 1]) + "\n", encoding="utf-8")
    rollout = json.loads((out / "verifiers-results.jsonl").read_text(encoding="utf-8").splitlines()[1])
    rollout["trajectory"][1]["tokens"]["prompt_ids"] = "see prompt"
    (bad / "verifiers.jsonl").write_text(json.dumps(rollout) + "\n", encoding="utf-8")
    rollouts = json.loads((out / "verifiers-results.json").read_text(encoding="utf-8"))
    del rollouts[2]["trajectory"][1]["tokens"]["completion_ids"]
    (bad / "verifiers.json").write_text(json.dumps(rollouts[:3]) + "\n", encoding="utf-8")
    atif = json.loads((out / "atif.json").read_text(encoding="utf-8"))
    atif["steps"][3]["step_id"] = 7
    (bad / "atif.json").write_text(json.dumps(atif, indent=2) + "\n", encoding="utf-8")
    openai_lines = (out / "openai.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(openai_lines[2])
    record["response"]["choices"] = []
    (bad / "openai.jsonl").write_text("\n".join([openai_lines[0], openai_lines[1], json.dumps(record)]) + "\n",
                                      encoding="utf-8")
    mini = json.loads((out / "mini-swe-agent.traj.json").read_text(encoding="utf-8"))
    del mini["messages"][2]["role"]
    (bad / "mini-swe-agent.traj.json").write_text(json.dumps(mini, indent=2) + "\n", encoding="utf-8")
    swe = json.loads((out / "swe-agent.traj").read_text(encoding="utf-8"))
    swe["history"][1]["role"] = "observer"
    (bad / "swe-agent.traj").write_text(json.dumps(swe, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    write_samples(args.out)
    write_malformed(args.out)


if __name__ == "__main__":
    main()
