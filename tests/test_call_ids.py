"""The call ids a client sends back: the engine's random ids as stable, distinct ids of the engine's own shape
(engine/call_ids.py), and every result of a parallel reply in one request."""

from __future__ import annotations

from engine.call_ids import SessionCallIds
from engine.simulate import run_cell
from tests.test_real_engines import need

FIRST, SECOND = "call_a62870f6abaf5de911338947", "call_b48a27d741479c3b7bf53691"  # sha256("tool call N")[:24]


def test_each_random_id_becomes_the_id_of_its_position_in_the_engines_shape():
    ids = SessionCallIds()
    assert [ids.client_id("call_<uuid>", n) for n in (0, 1)] == [FIRST, SECOND]
    assert SessionCallIds().client_id("call_<uuid>", 0) == FIRST  # the same in every session
    # vLLM's placeholder: the emulated release (0.33.0) draws 16 digits (vllm/utils random_uuid, from 0.12.0)
    assert SessionCallIds().client_id("chatcmpl-tool-<uuid>", 0) == "chatcmpl-tool-a62870f6abaf5de9"


def test_vllm_random_ids_of_either_length_are_made_stable_in_their_own_length():
    ids = SessionCallIds()
    # vLLM 0.12.0 on: 16 hex digits; before: 32
    assert ids.client_id("chatcmpl-tool-911c514d18d13adc", 0) == "chatcmpl-tool-a62870f6abaf5de9"
    assert ids.client_id("chatcmpl-tool-0123456789abcdef0123456789abcdef", 1) == \
        "chatcmpl-tool-b48a27d741479c3b7bf536911bcdfb03"


def test_a_real_release_repeating_one_random_id_keeps_the_repeat():
    ids = SessionCallIds()
    real = "call_0123456789abcdef01234567"
    assert [ids.client_id(real, 0), ids.client_id(real, 1), ids.client_id("call_fedcba9876543210fedcba98", 2)] == [
        FIRST, FIRST, "call_1b3d0dedb779c1921bfdf48d"]


def test_ids_the_engine_does_not_randomise_are_kept():
    ids = SessionCallIds()
    assert ids.client_id("functions.get_weather:0", 0) == "functions.get_weather:0"  # Kimi's numbering
    assert ids.client_id("functions.get_weather:0", 1) == "functions.get_weather:0"  # a repeat stays a repeat
    assert ids.client_id("call_XYZ", 2) == "call_XYZ"  # not SGLang's shape: the model's or a client's own


def test_parallel_calls_get_distinct_ids_and_both_results_go_in_the_next_request():
    # DeepSeek V4 through SGLang 0.5.23's deepseek-recipe, which refuses repeated ids and a call without a result.
    cell = run_cell("deepseek-v4", "parallel-tool-calls", "sglang")
    assert cell.status == "holds"
    sent = cell.boundaries[0].next_request.sent
    assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "tool"]
    assert [call["id"] for call in sent[-3]["tool_calls"]] == [FIRST, SECOND]
    assert [m["tool_call_id"] for m in sent[-2:]] == [FIRST, SECOND]


def test_a_real_releases_random_ids_are_the_same_in_every_run():
    need("sglang@0.5.22")
    cell = run_cell("qwen3.6", "parallel-tool-calls", "sglang@0.5.22")  # the release's code draws uuid4 ids
    assert [call["id"] for call in cell.boundaries[0].next_request.sent[-3]["tool_calls"]] == [FIRST, SECOND]


def test_a_vllm_release_drawing_16_digit_ids_gives_the_same_ids_in_every_run():
    need("vllm@0.33.0")
    # MiniMax M2.7's tool parser runs in vLLM 0.33.0's own code (no emulation), which draws 16-digit ids
    cell = run_cell("minimax-m2.7", "parallel-tool-calls", "vllm")
    assert [call["id"] for call in cell.boundaries[0].next_request.sent[-3]["tool_calls"]] == [
        "chatcmpl-tool-a62870f6abaf5de9", "chatcmpl-tool-b48a27d741479c3b"]


def test_a_trace_replay_sends_back_the_random_ids_the_logged_server_drew():
    from engine.traces.pipeline import returned_message
    from engine.types import ParseResult, ToolCall

    parsed = ParseResult(None, "", (ToolCall("call_<uuid>", "f", "{}"), ToolCall("functions.f:1", "f", "{}"),
                                    ToolCall(None, "f", "{}")))
    message = returned_message(parsed, ["call_0123456789abcdef01234567", "functions.f:7"], calls_so_far=4)
    # The random one is the server's draw as logged; Kimi's numbering is the engine's own; a missing id is numbered.
    assert [c["id"] for c in message["tool_calls"]] == ["call_0123456789abcdef01234567", "functions.f:1", "call_6"]
