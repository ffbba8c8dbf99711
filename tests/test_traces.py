"""Your own traffic: every sample format loads, its sessions and per-step figures are exact, every break is replayed
and attributed, and a malformed file of each format gets its one sentence.

The samples in samples/traces/ are our simulator's sessions (Qwen3.5, real template and tokenizer) written as the
engines and packages write them (samples/traces/generate.py). Each session is one scenario: tool-call holds;
next-user-turn loses the reasoning at the next user turn (template line 114); args-serialization has vLLM's / SGLang's
parameter trim; client-drops-reasoning is a client our replay does not model; noncanonical-tokens is a sampled
tokenization the prompt does not give back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.traces.readers import detect_format, read_trace
from engine.traces.records import TraceFormatError
from engine.traces.report import analyse_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "traces"

# (prompt, reused, prefill, block-16 reused, hybrid reused, first differing token) per request
HOLDS = [(1015, 0, 1015, 0, 0, None), (1081, 1059, 22, 1056, 1059, None)]
REASONING_DROPPED = [(1015, 0, 1015, 0, 0, None), (1074, 1052, 22, 1040, 1052, None), (1085, 1013, 72, 1008, 0, 1013)]
PARSER_VLLM = [(1067, 0, 1067, 0, 0, None), (1225, 1118, 107, 1104, 1067, 1118)]
CLIENT = [(1015, 0, 1015, 0, 0, None), (1065, 1014, 51, 1008, 0, 1014)]
TOKENIZER = [(1011, 0, 1011, 0, 0, None), (1063, 1011, 52, 1008, 1011, 1011)]
# Through SGLang the template gets SGLang's pydantic dump of the tool (`"defer_loading": null`): 6 tokens more in
# every prompt of the sample, the same causes.
SGLANG_FIGURES = [
    [(1021, 0, 1021, 0, 0, None), (1087, 1065, 22, 1056, 1065, None)],
    [(1021, 0, 1021, 0, 0, None), (1080, 1058, 22, 1056, 1058, None), (1091, 1019, 72, 1008, 0, 1019)],
    [(1073, 0, 1073, 0, 0, None), (1233, 1124, 109, 1120, 1073, 1124)],
    [(1021, 0, 1021, 0, 0, None), (1071, 1020, 51, 1008, 0, 1020)],
    [(1017, 0, 1017, 0, 0, None), (1069, 1017, 52, 1008, 1017, 1017)],
]

# The same causes as the matrix cells of these scenarios (qwen3.5 × scenario × engine).
CLIENT_CAUSE = ("client", "client-dropped-field",
                "the client sent the assistant turn back without reasoning_content (send_reasoning=False)")
TEMPLATE_CAUSE = ("template", "reasoning-dropped", "Qwen-Qwen3.5-0.8B.jinja:100-103")
TOKENIZER_CAUSE = ("tokenizer", "retokenised", "tokenizer.json:0")
VLLM_PARSER_CAUSE = ("parser", "args-type-coerced", "vllm/parser/engine/parser_engine.py:437-462")
SGLANG_PARSER_CAUSE = ("parser", "args-type-coerced", "sglang/srt/function_call/qwen3_coder_detector.py:229")


def figures(report) -> list[list[tuple]]:
    return [[(s.row.prompt_tokens, s.row.reusable_tokens, s.row.prefill_tokens, s.row.block_reusable_tokens,
              s.row.hybrid_reusable_tokens, s.first_break.token if s.first_break else None) for s in session.steps]
            for session in report.sessions]


def causes(report) -> dict[int, tuple | None]:
    """Per session (1-based): the breaking request's cause as (stage, kind, location), None when not reproduced;
    a client cause is (stage, kind, what changed)."""
    out = {}
    for (session, _), replay in sorted(report.replays.items()):
        cause = replay.cause
        if not replay.reproduced or cause is None:
            out[session] = None
        elif cause.stage == "client":
            out[session] = (cause.stage, cause.kind, cause.changed)
        else:
            out[session] = (cause.stage, cause.kind, str(cause.location))
    return out


@pytest.fixture(scope="module")
def qwen35_model():
    from engine.models import load_model

    return load_model("qwen3.5")


@pytest.mark.parametrize(("name", "expected"), [
    ("vllm-0.33.0.log", "vllm-log"), ("sglang-0.5.23.log", "sglang-log"), ("verifiers-results.jsonl", "verifiers"),
    ("verifiers-results.json", "verifiers-json"),
    ("atif.json", "atif"), ("openai.jsonl", "openai-jsonl"), ("mini-swe-agent.traj.json", "mini-swe-agent"),
    ("swe-agent.traj", "swe-agent"),
])
def test_each_sample_is_detected(name: str, expected: str) -> None:
    head = (SAMPLES / name).read_text(encoding="utf-8")[:1 << 20]
    assert detect_format(name, head) == expected


def test_vllm_log_interleaved_sessions_by_conversation(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "vllm-0.33.0.log", qwen35_model, engine="vllm@0.33.0", hints=False)
    assert report.format == "vllm-log"
    assert [s.key for s in report.sessions] == [f"conversation-{n}" for n in range(1, 6)]
    assert figures(report) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER]
    assert causes(report) == {2: TEMPLATE_CAUSE, 3: VLLM_PARSER_CAUSE, 4: CLIENT_CAUSE, 5: TOKENIZER_CAUSE}
    client = report.replays[(4, 2)]
    assert client.detail == ("the replay through vllm@0.33.0 with a client that drops the reasoning gives the real "
                             "prompt; cause: client (client-dropped-field) at vllm-log:line 37:0")
    # The replays ran on the messages of the JSON body records, matched to their request by id.
    assert report.sessions[0].steps[0].request.request_id.startswith("chatcmpl-")
    assert report.replays[(2, 3)].reproduced


def test_sglang_log(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "sglang-0.5.23.log", qwen35_model, engine="sglang@0.5.23", hints=False)
    assert figures(report) == SGLANG_FIGURES
    assert causes(report) == {2: TEMPLATE_CAUSE, 3: SGLANG_PARSER_CAUSE, 4: CLIENT_CAUSE, 5: TOKENIZER_CAUSE}
    assert report.sessions[1].steps[2].request.request_id == "next-user-turn-2-3"
    assert report.sessions[1].steps[2].request.cached_tokens == 0  # what the log says SGLang reused


def test_verifiers_sessions_by_trajectory_id(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "verifiers-results.jsonl", qwen35_model, engine="vllm@0.33.0", hints=False)
    assert len(report.sessions) == 5 and len(report.sessions[0].key) == 32
    assert figures(report) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER]
    assert causes(report) == {2: TEMPLATE_CAUSE, 3: VLLM_PARSER_CAUSE, 4: CLIENT_CAUSE, 5: TOKENIZER_CAUSE}


def test_verifiers_rollouts_saved_as_one_json_list(qwen35_model, tmp_path: Path) -> None:
    """The same rollouts as results.jsonl, saved with json.dump (one line, as a dataset's to_json(lines=False) too)
    and indented: the same sessions, figures and causes."""
    jsonl = analyse_trace(SAMPLES / "verifiers-results.jsonl", qwen35_model, engine="vllm@0.33.0", hints=False)
    indented = tmp_path / "results.json"
    indented.write_text(json.dumps(json.loads((SAMPLES / "verifiers-results.json").read_text(encoding="utf-8")),
                                   indent=2), encoding="utf-8")
    for path in (SAMPLES / "verifiers-results.json", indented):
        report = analyse_trace(path, qwen35_model, engine="vllm@0.33.0", hints=False)
        assert report.format == "verifiers-json"
        assert [s.key for s in report.sessions] == [s.key for s in jsonl.sessions]
        assert figures(report) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER]
        assert causes(report) == causes(jsonl)
        assert report.sessions[1].steps[2].request.where == "rollout [1], trajectory[2]"


def test_openai_jsonl_sessions_by_session_id(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "openai.jsonl", qwen35_model, engine="vllm@0.33.0", hints=False)
    assert [s.key for s in report.sessions] == ["noncanonical-tokens-5", "client-drops-reasoning-4",
                                                 "args-serialization-3", "next-user-turn-2", "tool-call-1"]
    assert figures(report) == [TOKENIZER, CLIENT, PARSER_VLLM, REASONING_DROPPED, HOLDS]


def test_atif_trajectory(qwen35_model) -> None:
    from atif import Trajectory

    document = json.loads((SAMPLES / "atif.json").read_text(encoding="utf-8"))
    Trajectory.model_validate(document)  # the sample is what the atif 1.8.0 schema accepts
    report = analyse_trace(SAMPLES / "atif.json", qwen35_model, engine="vllm@0.33.0")
    assert figures(report) == [REASONING_DROPPED]
    replay = report.replays[(1, 3)]
    assert replay.reproduced and replay.cause is not None
    fix = replay.cause.to_json()["fix"]
    assert (fix["kind"], fix["proof"]) == ("bridge", "re-run with the bridge: the boundary holds")


def test_mini_swe_agent_ids_from_the_response_and_no_tools(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "mini-swe-agent.traj.json", qwen35_model, engine="vllm@0.33.0", hints=False)
    assert report.sessions[0].ids_source == "logged"
    assert figures(report) == [REASONING_DROPPED]
    replay = report.replays[(1, 3)]
    assert not replay.reproduced
    assert "mini-swe-agent records no tool list" in replay.detail


def test_swe_agent_without_ids_is_rendered(qwen35_model) -> None:
    report = analyse_trace(SAMPLES / "swe-agent.traj", qwen35_model, engine="vllm@0.33.0", hints=False)
    assert report.sessions[0].ids_source == "rendered"
    assert figures(report) == [[(739, 0, 739, 0, 0, None), (789, 738, 51, 736, 0, 738), (809, 737, 72, 736, 0, 737)]]


def test_swe_agent_needs_a_model() -> None:
    with pytest.raises(Exception, match="logs no token ids, so the prompts are rendered"):
        analyse_trace(SAMPLES / "swe-agent.traj")


def test_ids_only_figures_need_no_model() -> None:
    report = analyse_trace(SAMPLES / "vllm-0.33.0.log")
    assert figures(report) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER]
    assert report.replays == {}


MALFORMED = {
    "vllm.log": "vllm.log: line 2: the JSON body of request 2ad1245c92010b38 is not valid JSON (Unterminated "
                "string starting at, column 41); was it cut by --max-log-len?",
    "sglang.log": "sglang.log: line 11: obj.input_ids of request noncanonical-tokens-5-1 was cut short (a \"...\" in "
                  "the list); SGLang logs whole id lists only at --log-requests-level 3",
    "verifiers.jsonl": "verifiers.jsonl: line 1, trajectory[1]: tokens.prompt_ids is not a list of token ids (got "
                       "str)",
    "verifiers.json": "verifiers.json: rollout [2], trajectory[1]: tokens.completion_ids is not a list of token ids "
                      "(got NoneType)",
    "atif.json": "atif.json: steps[3]: step_id=7 is not sequential; expected 4",
    "openai.jsonl": "openai.jsonl: line 3: response.choices is empty or not a list",
    "mini-swe-agent.traj.json": "mini-swe-agent.traj.json: messages[2]: a message needs a role",
    "swe-agent.traj": "swe-agent.traj: history[1]: a history entry needs role system, user, assistant or tool",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_file_gets_one_sentence(name: str) -> None:
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(SAMPLES / "malformed" / name))
    assert str(caught.value) == MALFORMED[name]


def test_an_unknown_file_gets_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n", encoding="utf-8")
    with pytest.raises(TraceFormatError) as caught:
        list(read_trace(path))
    assert str(caught.value) == ("notes.txt: line 1 is not any trace format read here (vllm-log, sglang-log, atif, "
                                 "mini-swe-agent, swe-agent, verifiers, verifiers-json, openai-jsonl): 'hello'")


def test_cli_json_shape() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "trace", str(SAMPLES / "vllm-0.33.0.log"), "--model",
                          "qwen3.5", "--engine", "vllm@0.33.0", "--no-hints", "--json", "-"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert [len(s["requests"]) for s in data["sessions"]] == [2, 3, 2, 2, 2]
    broken = data["sessions"][1]["requests"][2]
    assert {k: broken[k] for k in ("prompt_tokens", "reused_tokens", "prefill_tokens", "breaks")} == \
        {"prompt_tokens": 1085, "reused_tokens": 1013, "prefill_tokens": 72, "breaks": True}
    assert broken["first_break"]["previous_token_text"] == "<think>"
    assert broken["first_break"]["next_token_text"] == "<tool_call>"
    assert broken["cause"]["stage"] == "template"
    assert broken["cause"]["location"] == "Qwen-Qwen3.5-0.8B.jinja:100-103"
    assert {"stage", "kind", "location", "origin", "detail", "fix"} <= set(broken["cause"])
    assert data["sessions"][0]["totals"] == {"prompt_tokens": 2096, "reused_tokens": 1059, "prefill_tokens": 1037,
                                             "lost_tokens": 0, "breaks": 0}


def test_logs_are_read_line_by_line() -> None:
    """The first request comes out while most of the log is still unread (only pending requests are kept)."""
    from engine.traces.readers import FORMATS

    lines = (SAMPLES / "vllm-0.33.0.log").read_text(encoding="utf-8").splitlines(keepends=True)
    consumed = 0

    def feed():
        nonlocal consumed
        for line in lines:
            consumed += 1
            yield line

    first = next(FORMATS["vllm-log"].read("vllm-0.33.0.log", feed()))
    assert first.prompt_ids is not None and first.completion_ids is not None
    assert consumed < len(lines) // 2


def test_samples_of_one_prompt_are_separate_sessions(tmp_path: Path) -> None:
    """Each session's first request again under another request id (a second sample of the same prompt): a session
    of its own, not a continuation."""
    import re

    lines = (SAMPLES / "vllm-0.33.0.log").read_text(encoding="utf-8").splitlines(keepends=True)
    first_wave = lines[1:26]  # the five first requests and their outputs
    assert sum("details: prompt" in line for line in first_wave) == 5
    again = re.sub(r"\b([0-9a-f]{16})\b", r"b\1", "".join(first_wave))
    path = tmp_path / "twice.log"
    path.write_text("".join(lines) + again, encoding="utf-8")
    report = analyse_trace(path)
    assert figures(report) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER] + \
        [[s[0]] for s in (HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER)]


# ---- sessions by conversation -------------------------------------------------------------------------------------
# The same traffic written in four forms: GLM-5.1's real template (which drops earlier reasoning at a new user turn:
# a rewrite of the history right after the first prompt) and tokenizer, our scenarios through vllm@0.33.0's request
# side and parsers, written as samples/traces/generate.py writes each form. tool-call and next-user-turn open alike
# (the same system prompt and question: two samples of one prompt), and part at the model's first reply.
GLM_TRAFFIC = (("tool-call", False), ("next-user-turn", False), ("no-tools-next-user", True),
               ("args-serialization", True), ("client-drops-reasoning", True))


def _generator():
    sys.path.insert(0, str(SAMPLES))
    import generate

    return generate


@pytest.fixture(scope="module")
def glm_traffic(tmp_path_factory):
    """{form: path} and, per conversation, the request of each form's own identity."""
    import random
    from dataclasses import replace

    from engine.models import load_model
    from engine.scenario import ScriptTurn, load_scenario

    generate = _generator()
    model = load_model("glm-5.1")
    rng = random.Random(26)
    conversations = []
    for n, (scenario_id, own_ticket) in enumerate(GLM_TRAFFIC, start=1):
        scenario = load_scenario(scenario_id)
        scenario = generate.as_session(scenario, n) if own_ticket else replace(
            scenario, turns=scenario.turns + (ScriptTurn("assistant", assistant=generate.CLOSING),))
        requests = generate.run_session(model, scenario, "vllm@0.33.0", f"{scenario_id}-{n}")
        for r in requests:
            r.request_id = f"{rng.getrandbits(64):016x}"
        conversations.append(requests)
    out = tmp_path_factory.mktemp("glm-traffic")
    paths = {"vllm-log": out / "vllm.log", "sglang-log": out / "sglang.log", "openai-jsonl": out / "openai.jsonl",
             "verifiers-json": out / "results.json"}
    generate.write_vllm(paths["vllm-log"], conversations, "zai-org/GLM-5.1")
    generate.write_sglang(paths["sglang-log"], conversations, "zai-org/GLM-5.1", model)
    generate.write_openai(paths["openai-jsonl"], conversations, "zai-org/GLM-5.1")
    generate.write_verifiers(paths["verifiers-json"], conversations, "zai-org/GLM-5.1", as_list=True)
    trajectory = {n: f"{random.Random(n).getrandbits(128):032x}" for n in range(len(conversations))}
    identity = {}  # (form, request id as the report gives it) -> (conversation, request number)
    for n, requests in enumerate(conversations):
        for r in requests:
            here = (n, r.number)
            identity[("vllm-log", f"chatcmpl-{r.request_id}")] = here
            identity[("openai-jsonl", f"chatcmpl-{r.request_id}")] = here
            identity[("sglang-log", f"{r.session}-{r.number}")] = here
            identity[("verifiers-json", f"{trajectory[n]}#{r.number - 1}")] = here
    return paths, identity, conversations


def test_one_session_per_conversation_in_every_form_and_each_rewrite_is_a_break_inside_it(glm_traffic) -> None:
    """`python -m engine trace FILE --json -` on the vLLM log, the SGLang log, the OpenAI JSONL and the verifiers list
    of the same traffic: the same sessions, each holding one conversation's requests in order, and the same breaks
    (request, first differing token, reuse). The logs have no session ids: their sessions are found by messages."""
    paths, identity, conversations = glm_traffic
    truth = [[(n, r.number) for r in requests] for n, requests in enumerate(conversations)]
    seen = {}
    for form, path in paths.items():
        done = subprocess.run([sys.executable, "-m", "engine", "trace", str(path), "--json", "-"], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        data = json.loads(done.stdout)
        assert data["format"] == form
        sessions = {tuple(identity[(form, r["request_id"])] for r in s["requests"]): [
            (r["prompt_tokens"], r["reused_tokens"], r["breaks"], (r.get("first_break") or {}).get("token"))
            for r in s["requests"]] for s in data["sessions"]}
        assert sorted(sessions) == sorted(map(tuple, truth)), form
        seen[form] = sessions
    assert seen["vllm-log"] == seen["sglang-log"] == seen["openai-jsonl"] == seen["verifiers-json"]
    # The breaks: GLM's template drops the earlier reasoning at each new user turn, right after the first prompt
    # (next-user-turn and no-tools-next-user, their third and second request); vLLM's parser trims the parameter of
    # args-serialization; the client drops the reasoning. tool-call holds.
    figures = seen["vllm-log"]
    breaks = {conversations[key[0][0]][0].session: [i for i, step in enumerate(steps, 1) if step[2]]
              for key, steps in figures.items()}
    assert breaks == {"tool-call-1": [], "next-user-turn-2": [3], "no-tools-next-user-3": [2],
                      "args-serialization-4": [2], "client-drops-reasoning-5": [2]}
    first_prompt = figures[tuple(truth[1])][0][0]
    rewrite = figures[tuple(truth[1])][2]
    assert rewrite[2] and first_prompt - 3 <= rewrite[3] < first_prompt  # early: inside the first prompt's turn


def test_a_client_that_rewrites_the_history_stays_in_its_session(glm_traffic, tmp_path: Path) -> None:
    """The client summarises a tool result before the next request: no longer a prefix as messages, but the request
    holds the conversation's first request, so it stays in its session, where the replay names the rewrite."""
    from dataclasses import replace

    from engine.models import load_model
    from engine.traces.pipeline import render_request, served_by, template_kwargs

    generate = _generator()
    _, _, conversations = glm_traffic
    model = load_model("glm-5.1")
    first, second, last = conversations[1]  # next-user-turn
    messages = [dict(m) for m in last.messages]
    tool = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    messages[tool]["content"] = "sunny"  # was "sunny, 21°C"
    prompt, _, _ = render_request(model, served_by("vllm@0.33.0"), messages, last.tools, template_kwargs(model, {}))
    rewritten = replace(last, messages=messages, prompt_text=prompt.text,
                        prompt_ids=tuple(model.tokenizer.encode(prompt.text).ids))
    path = tmp_path / "rewrite.log"
    generate.write_vllm(path, [conversations[0], [first, second, rewritten]], "zai-org/GLM-5.1")
    report = analyse_trace(path, model, engine="vllm@0.33.0", hints=False)
    assert [[s.request.request_id for s in session.steps] for session in report.sessions] == [
        [f"chatcmpl-{r.request_id}" for r in conversations[0]],
        [f"chatcmpl-{r.request_id}" for r in (first, second, rewritten)]]
    assert [s.breaks for s in report.sessions[1].steps] == [False, False, True]
    replay = report.replays[(2, 3)]
    assert not replay.reproduced and replay.detail.startswith("the client rewrote the history: message 3 of line ")


def test_grouping_is_a_plain_function_over_the_records(glm_traffic, tmp_path: Path) -> None:
    """engine.traces.grouping.group_sessions over the requests read from a file gives the report's sessions; the
    vLLM log without its JSON bodies (no messages) is grouped by token prefix into the same sessions, where the
    conversations do not open alike."""
    from engine.traces.grouping import group_sessions

    paths, _, _ = glm_traffic
    keys = [key for key, _ in group_sessions(read_trace(paths["vllm-log"]))]
    assert sorted(set(keys)) == [f"conversation-{n}" for n in range(1, 6)]
    assert len(keys) == 11
    sample = SAMPLES / "vllm-0.33.0.log"
    without_bodies = tmp_path / "no-bodies.log"
    without_bodies.write_text("".join(line for line in sample.read_text(encoding="utf-8").splitlines(keepends=True)
                                      if " JSON body: " not in line), encoding="utf-8")
    assert all(r.messages is None for r in read_trace(without_bodies))
    by_tokens = analyse_trace(without_bodies)
    assert [s.key for s in by_tokens.sessions] == [f"prefix-{n}" for n in range(1, 6)]
    assert figures(by_tokens) == [HOLDS, REASONING_DROPPED, PARSER_VLLM, CLIENT, TOKENIZER]
