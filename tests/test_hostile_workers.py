"""A worker that hangs, crashes or is killed mid-run: the request gets one sentence, the next request a fresh worker.

Real workers only: a release's own code in its sandboxed worker (engine/serving/real: sglang@0.5.23, from the engine
cache or PyPI; `require_release` skips outside CI when neither has it) and the upload sandbox's render worker
(engine/sandbox.py). A hang is the worker stopped with SIGSTOP (it then answers nothing, as a job in an endless loop
would) under a short time limit; a kill mid-run is SIGKILL once the request is in the worker's stdin pipe. Every wait
is on a condition (the request's bytes in the pipe, the process reaped), never a fixed sleep.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import require_release

from engine.errors import RenderError
from engine.sandbox import RenderLimitExceeded, RenderLimits, SandboxedRenderer, _pool
from engine.types import ParseResult

SPEC = ("sglang", "0.5.23")
QWEN_VOCAB = {"<think>": 151667, "</think>": 151668, "<tool_call>": 151657, "</tool_call>": 151658}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
ANSWER_AROUND_CALL = ("<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                      "</parameter>\n</function>\n</tool_call>")
CONDITION_TIMEOUT_S = 60.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = CONDITION_TIMEOUT_S) -> None:
    """Poll `condition` until it holds (a guard against a hang, not a delay: it returns as soon as it holds)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def stop(pid: int) -> None:
    """SIGSTOP the process and wait until it is stopped: a signal takes effect when the process next runs, and one
    blocked reading a pipe that meanwhile got data reads it first, so a request written before then could be consumed
    before the stop."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("T", "t")

    wait_for(stopped, f"process {pid} to stop")


def pipe_bytes(stream: Any) -> int:
    """Bytes written to a pipe and not yet read from it (FIONREAD works on either end of a Linux pipe)."""
    return struct.unpack("i", fcntl.ioctl(stream.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def run_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# ---- a release's worker (engine/serving/real) -------------------------------------------------------------------

@pytest.fixture
def release(monkeypatch):
    """sglang@0.5.23's RealEngine, its worker started and answering, stopped again afterwards; every request asks the
    worker (the persistent result cache, which would answer a repeated job without it, is off)."""
    require_release("@".join(SPEC))
    from engine.serving.real import backend

    monkeypatch.setenv("DRIFT_RESULT_CACHE", "0")

    backend.stop_workers()
    engine = backend.RealEngine(*SPEC)
    yield engine, backend
    backend.stop_workers()


def parse(engine: Any) -> ParseResult:
    from engine.serving.real.backend import AddedVocab

    return engine.parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS,
                        vocab=AddedVocab(QWEN_VOCAB, frozenset()), trace=False)


def answer(result: ParseResult) -> tuple:
    return result.error, result.reasoning, result.content, [(c.name, c.arguments) for c in result.tool_calls]


# SGLang keeps the reasoning verbatim from 0.5.13 on (REAL-ENGINES.md)
GOOD_ANSWER = (None, "\nhmm\n", "\n\nSure.\n", [("get_weather", '{"city": "Paris"}')])


@pytest.mark.real_engine
@pytest.mark.slow
def test_a_hung_release_worker_is_one_sentence_and_the_next_parse_gets_a_fresh_one(release, monkeypatch):
    engine, backend = release
    assert answer(parse(engine)) == GOOD_ANSWER
    worker = backend.worker_for(*SPEC)
    hung = worker.proc.pid
    monkeypatch.setenv("DRIFT_ENGINE_PARSE_TIMEOUT_S", "2")
    stop(hung)  # answers nothing from now on, as a job that loops forever
    started = time.monotonic()
    result = parse(engine)
    assert result.error == "the sglang@0.5.23 worker did not parse within 2 s"
    assert (result.reasoning, result.content, result.tool_calls) == (None, None, ())
    assert time.monotonic() - started < 30
    assert worker.proc is None  # killed, not left behind
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)
    monkeypatch.delenv("DRIFT_ENGINE_PARSE_TIMEOUT_S")
    assert answer(parse(engine)) == GOOD_ANSWER
    assert worker.proc is not None and worker.proc.pid != hung


@pytest.mark.real_engine
@pytest.mark.slow
def test_a_release_worker_killed_mid_parse_is_one_sentence_and_the_next_parse_gets_a_fresh_one(release):
    engine, backend = release
    assert answer(parse(engine)) == GOOD_ANSWER
    worker = backend.worker_for(*SPEC)
    victim = worker.proc.pid
    stdin = worker.proc.stdin
    stop(victim)  # holds the request unread until the kill: the kill lands mid-request
    thread, outcome = run_in_thread(lambda: parse(engine))
    wait_for(lambda: pipe_bytes(stdin) > 0, "the parse request to reach the worker's stdin")
    os.kill(victim, signal.SIGKILL)
    thread.join(CONDITION_TIMEOUT_S)
    assert not thread.is_alive() and "error" not in outcome
    assert outcome["value"].error == "the sglang@0.5.23 worker exited during parse (status -9; memory limit 3072 MB)"
    assert answer(parse(engine)) == GOOD_ANSWER
    assert worker.proc is not None and worker.proc.pid != victim


@pytest.mark.real_engine
@pytest.mark.slow
def test_a_release_worker_that_died_between_parses_is_replaced_unnoticed(release):
    engine, backend = release
    assert answer(parse(engine)) == GOOD_ANSWER
    worker = backend.worker_for(*SPEC)
    crashed = worker.proc.pid
    os.kill(crashed, signal.SIGKILL)
    assert worker.proc.wait(CONDITION_TIMEOUT_S) == -signal.SIGKILL  # reaped: the worker is known dead
    assert answer(parse(engine)) == GOOD_ANSWER
    assert worker.proc.pid != crashed


@pytest.mark.real_engine
@pytest.mark.slow
def test_a_hung_release_worker_is_a_cell_error_and_the_next_cell_holds(release, monkeypatch):
    from engine.models import load_model
    from engine.simulate import run_cell_with

    def run_cell():  # not run_cell: it keeps cells by their arguments
        return run_cell_with(load_model("qwen3.5"), "tool-call", "real:sglang@0.5.23", {})

    engine, backend = release
    good = run_cell()
    assert good.status == "holds"
    worker = backend.worker_for(*SPEC)
    hung = worker.proc.pid
    monkeypatch.setenv("DRIFT_ENGINE_PARSE_TIMEOUT_S", "2")
    stop(hung)
    cell = run_cell()
    assert cell.status == "error"
    assert cell.note == ("sglang 0.5.23 (real code) rejects the next request: sglang@0.5.23's request side did not "
                         "answer: the sglang@0.5.23 worker did not render within 2 s")
    monkeypatch.delenv("DRIFT_ENGINE_PARSE_TIMEOUT_S")
    again = run_cell()
    assert (again.status, again.note) == (good.status, good.note)
    assert worker.proc is not None and worker.proc.pid != hung


@pytest.mark.real_engine
@pytest.mark.slow
def test_a_release_worker_hung_while_listing_its_parsers_is_one_sentence_and_the_next_request_a_fresh_one(
        release, monkeypatch, tmp_path):
    from engine.models import load_model
    from engine.simulate import run_cell_with

    engine, backend = release
    # The release's parser names not yet listed (the engine cache keeps them once they are): the first request of
    # this release asks its worker for them.
    listed = tmp_path / "parsers.json"
    monkeypatch.setattr(backend.RealEngine, "parser_names_path", property(lambda self: listed))
    monkeypatch.setenv("DRIFT_ENGINE_LIST_TIMEOUT_S", "2")
    worker = backend.worker_for(*SPEC)
    hung = worker.proc.pid
    stop(hung)
    result = parse(engine)
    assert result.error == "the sglang@0.5.23 worker did not list its parsers within 2 s"
    assert (result.reasoning, result.content, result.tool_calls) == (None, None, ())
    assert worker.proc is None  # killed, not left behind
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)
    assert not listed.exists()

    # A cell whose release hangs there: the cell's one sentence, in place of its figures.
    assert worker.ask({"op": "hello"}, CONDITION_TIMEOUT_S)["ok"]  # a fresh worker, stopped in turn
    hung = worker.proc.pid
    stop(hung)
    cell = run_cell_with(load_model("qwen3.5"), "tool-call", "real:sglang@0.5.23", {})
    assert (cell.status, cell.note) == (
        "error", "sglang 0.5.23 (real code): the sglang@0.5.23 worker did not list its parsers within 2 s")
    assert cell.boundaries == ()

    monkeypatch.delenv("DRIFT_ENGINE_LIST_TIMEOUT_S")
    assert answer(parse(engine)) == GOOD_ANSWER
    assert worker.proc is not None and worker.proc.pid != hung
    assert {"qwen3", "qwen3_coder"} <= set(json.loads(listed.read_text())["tool_parsers"]) | \
        set(json.loads(listed.read_text())["reasoning_parsers"])


# ---- the upload sandbox's render worker (engine/sandbox.py) ------------------------------------------------------

MODEL = "qwen3.5"
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
BASIC = [{"role": "user", "content": "hi"}]


def sandbox_renderer(timeout_s: float = 30.0) -> SandboxedRenderer:
    # A template of its own (its own worker), so that other tests' workers are not touched.
    return SandboxedRenderer(TEMPLATE + "{# " + str(time.monotonic_ns()) + " #}", model=MODEL,
                             source_path="custom.jinja", limits=RenderLimits(timeout_s=timeout_s))


def sandbox_stdin(renderer: SandboxedRenderer) -> Any:
    return _pool[(renderer.limits.memory_mb, renderer._worker_key)]._proc.stdin


@pytest.mark.slow
def test_a_hung_render_worker_is_the_time_limit_and_the_next_render_gets_a_fresh_one():
    renderer = sandbox_renderer()
    assert renderer.render(BASIC, None, add_generation_prompt=False).text == "<user>hi"
    hung = renderer.worker_pid
    stop(hung)
    roomy, renderer.limits = renderer.limits, RenderLimits(timeout_s=1.5)  # short only while the worker is stopped
    with pytest.raises(RenderLimitExceeded) as caught:
        renderer.render(BASIC, None, add_generation_prompt=False)
    renderer.limits = roomy
    assert str(caught.value) == f"custom.jinja for model {MODEL} was stopped after 1.5 s (render time limit)"
    assert caught.value.limit == "time"
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)
    assert renderer.render(BASIC, None, add_generation_prompt=False).text == "<user>hi"
    assert renderer.worker_pid not in (None, hung)


@pytest.mark.slow
def test_a_render_worker_killed_mid_render_is_one_sentence_and_the_next_render_gets_a_fresh_one():
    renderer = sandbox_renderer()
    assert renderer.render(BASIC, None, add_generation_prompt=False).text == "<user>hi"
    victim = renderer.worker_pid
    stdin = sandbox_stdin(renderer)
    stop(victim)
    thread, outcome = run_in_thread(lambda: renderer.render(BASIC, None, add_generation_prompt=False))
    wait_for(lambda: pipe_bytes(stdin) > 0, "the render request to reach the worker's stdin")
    os.kill(victim, signal.SIGKILL)
    thread.join(CONDITION_TIMEOUT_S)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert type(error) is RenderError
    assert str(error) == (f"custom.jinja for model {MODEL} crashed the sandbox worker (exit status -9); the memory "
                          "limit is 1024 MB")
    assert renderer.render(BASIC, None, add_generation_prompt=False).text == "<user>hi"
    assert renderer.worker_pid not in (None, victim)
