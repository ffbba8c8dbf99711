"""Lazy provenance: a render gives its text first and records which message and line made each character only when
someone reads `message_index` / `source_line`. The text must be byte-identical to the recording render's, the
provenance identical to a recording render's, and the matrix's common path (a boundary that holds) must never
record. Also: cause attribution's re-runs stop at the boundary they ask about."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from conversations import CONVERSATIONS

from engine.errors import RenderError
from engine.matrix import MatrixRequest, boundary_json, run_matrix
from engine.models import LoadedModel, default_model_ids, load_model, load_spec
from engine.render.cache import CachedRenderer, request_key, watching_renders
from engine.render.deepseek_v4 import DeepSeekV4Renderer
from engine.render.jinja import JinjaRenderer
from engine.scenario import scenario_ids
from engine.session import load_session, run_what_if, simulate_session, what_if_names
from engine.simulate import ENGINES, run_cell_with
from engine.types import Rendered

PARITY_KWARGS = {  # the kwarg variants tests/test_render.py renders the parity conversations with
    "qwen3.6": [{}, {"preserve_thinking": True}, {"enable_thinking": False}],
    "qwen3.5": [{}, {"enable_thinking": True}],
    "glm-5.1": [{}, {"clear_thinking": False}, {"enable_thinking": False}],
    "kimi-k2.6": [{}, {"preserve_thinking": True}, {"thinking": False}],
    "gpt-oss": [{}, {"reasoning_effort": "high"}],
    "deepseek-v4": [{}, {"thinking": False}, {"drop_thinking": False}],
    "qwen3-coder": [{}], "qwen3-2507": [{}], "qwen2.5": [{}],
    "glm-4.7-flash": [{}, {"clear_thinking": False}, {"enable_thinking": False}],
    "deepseek-v3.1": [{}, {"thinking": True}],
    "minimax-m2.7": [{}], "deepseek-v3.2": [{}, {"thinking": True}],
    "llama-3.1": [{}, {"tools_in_user_message": False}], "mistral-small-3.2": [{}],
}


def _fresh(model_id: str) -> LoadedModel:
    """The model with an empty render cache of its own, so no earlier test has read any provenance."""
    stock = load_model(model_id)
    return dataclasses.replace(stock, renderer=CachedRenderer(stock.renderer.inner))


def _key(messages: list[dict], tools: list[dict] | None, generation_prompt: bool, kwargs: dict | None) -> str:
    return repr((messages, tools, generation_prompt, kwargs))


@contextmanager
def _recording(requests: dict[str, dict[str, tuple]]) -> Iterator[None]:
    """Record every distinct request each default model's renderer is asked for, by any of its ways to render (the
    matrix renders its scenarios' requests with render_kept)."""
    with ExitStack() as watching:
        for model_id in default_model_ids():
            seen = requests.setdefault(model_id, {})
            watching.enter_context(watching_renders(
                load_model(model_id).renderer, lambda *request, _seen=seen: _seen.setdefault(_key(*request), request)))
        yield


@pytest.fixture(scope="module")
def suite_requests() -> dict[str, dict[str, tuple]]:
    """The renders the test suite does: the default matrix and its cause attribution on every engine version, the
    web app's kwarg toggles, the parity conversations with their kwarg variants, the handbook session and its
    what-ifs."""
    requests: dict[str, dict[str, tuple]] = {}
    models = tuple(default_model_ids())
    toggled: dict[str, dict] = {}
    for model_id in models:
        kwarg = next((k for k in load_spec(model_id).template_kwargs if isinstance(k.default, bool)), None)
        toggled[model_id] = {kwarg.name: not kwarg.default} if kwarg else {}
    with _recording(requests):
        for kwargs in ({}, toggled):
            for model_id in models:
                model = load_model(model_id)
                for scenario in scenario_ids():
                    for engine in (*ENGINES, "sglang@0.5.12"):
                        run_cell_with(model, scenario, engine, kwargs.get(model_id, {}))
        for model_id in models:
            renderer = load_model(model_id).renderer
            for messages, tools in CONVERSATIONS.values():
                for kwargs in PARITY_KWARGS[model_id]:
                    for generation_prompt in (True, False):
                        try:
                            renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=kwargs)
                        except RenderError:
                            pass  # checked below like any other request: both paths must refuse it alike
        model, script = load_model("qwen3.5"), load_session("handbook")
        simulate_session(model, script)
        for name in what_if_names():
            run_what_if(name, model, script)
    return requests


def _jinja_outcome(renderer: JinjaRenderer, request: tuple, *, recorded: bool) -> Rendered | str:
    messages, tools, generation_prompt, kwargs = request
    try:
        if recorded:
            chat, variables = renderer.template_context(messages, tools, generation_prompt, kwargs)
            return renderer._render_recorded(chat, variables)
        return renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=kwargs)
    except RenderError as err:
        return f"{err} (line {err.source_line})"


def test_suite_renders_cover_every_model(suite_requests: dict[str, dict[str, tuple]]) -> None:
    assert sorted(suite_requests) == sorted(default_model_ids())
    assert all(len(requests) >= 50 for requests in suite_requests.values())


@pytest.mark.parametrize("model_id", ["qwen3.6", "qwen3.5", "glm-5.1", "kimi-k2.6", "gpt-oss"])
def test_jinja_text_first_is_byte_identical_to_the_recording_render(
        model_id: str, suite_requests: dict[str, dict[str, tuple]]) -> None:
    renderer = load_model(model_id).renderer.inner
    assert isinstance(renderer, JinjaRenderer)
    for request in suite_requests[model_id].values():
        lazy = _jinja_outcome(renderer, request, recorded=False)
        eager = _jinja_outcome(renderer, request, recorded=True)
        if isinstance(eager, str):  # a refusal: the same sentence and line from both paths
            assert lazy == eager
            continue
        assert isinstance(lazy, Rendered) and not lazy.provenance_computed
        assert lazy.text == eager.text
        assert (lazy.message_index, lazy.source_line) == (eager.message_index, eager.source_line)
        assert lazy.provenance_computed and lazy == eager


def test_deepseek_untraced_text_is_byte_identical_to_the_traced_run(
        suite_requests: dict[str, dict[str, tuple]]) -> None:
    renderer = load_model("deepseek-v4").renderer.inner
    assert isinstance(renderer, DeepSeekV4Renderer)
    for messages, tools, generation_prompt, kwargs in suite_requests["deepseek-v4"].values():
        try:
            lazy = renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=kwargs)
        except RenderError as err:
            with pytest.raises(RenderError) as traced_error:
                renderer._run_traced(renderer.prepare(messages, tools, kwargs or {}))
            assert str(traced_error.value) == str(err)
            continue
        assert not lazy.provenance_computed
        _, traced_text = renderer._run_traced(renderer.prepare(messages, tools, kwargs or {}))
        assert lazy.text == traced_text
        assert len(lazy.message_index) == len(lazy.source_line) == len(lazy.text)


def test_a_holding_cell_never_records_provenance() -> None:
    for model_id, scenario in (("qwen3.6", "tool-call-id"), ("deepseek-v4", "next-user-turn")):
        cell = run_cell_with(_fresh(model_id), scenario, "raw", {})
        assert (cell.status, len(cell.boundaries)) == ("holds", 2)
        for boundary in cell.boundaries:
            assert not boundary.prev_prompt.provenance_computed
            assert not boundary.next_prompt.provenance_computed


def test_a_template_break_records_only_what_blame_reads() -> None:
    # qwen3.6 drops the reasoning of earlier turns: a template break at boundary 1, blamed on a template line.
    cell = run_cell_with(_fresh("qwen3.6"), "newline-after-think", "raw", {})
    assert cell.status == "breaks" and cell.cause is not None and cell.cause.stage == "template"
    first = cell.boundaries[0]
    assert first.next_prompt.provenance_computed and not first.prev_prompt.provenance_computed
    stock = run_cell_with(load_model("qwen3.6"), "newline-after-think", "raw", {})
    assert cell.cause == stock.cause


def test_stop_after_computes_only_the_boundaries_asked_for() -> None:
    model = load_model("kimi-k2.6")
    full = run_cell_with(model, "newline-after-think", "raw", {}, explain=False)
    assert [b.holds for b in full.boundaries] == [True, True, False]
    for stop_after in (1, 2):
        cut = run_cell_with(model, "newline-after-think", "raw", {}, explain=False, stop_after=stop_after)
        assert (cut.status, len(cut.boundaries)) == ("holds", stop_after)
        assert [boundary_json(b) for b in cut.boundaries] == [boundary_json(b) for b in full.boundaries[:stop_after]]
    cut = run_cell_with(model, "newline-after-think", "raw", {}, explain=False, stop_after=3)
    assert cut.status == "breaks" and [boundary_json(b) for b in cut.boundaries] == \
        [boundary_json(b) for b in full.boundaries]


def test_matrix_cells_equal_cells_rendered_with_provenance_read_at_once() -> None:
    """Reading every provenance as soon as it exists changes no figure, cause or fix of the matrix."""
    request = MatrixRequest(("qwen3.6", "deepseek-v4"), ("newline-after-think", "tool-call", "next-user-turn"),
                            ENGINES, {})
    lazy = [cell.__dict__ for cell in run_matrix(request)]

    class Eager(CachedRenderer):
        def render(self, *args, **kwargs) -> Rendered:
            rendered = super().render(*args, **kwargs)
            assert rendered.message_index is not None
            return rendered

    eager = []
    for model_id in request.models:
        model = dataclasses.replace(load_model(model_id), renderer=Eager(load_model(model_id).renderer.inner))
        for scenario in request.scenarios:
            for engine in request.engines:
                eager.append(run_cell_with(model, scenario, engine, {}).__dict__)
    assert lazy == eager


def test_rendered_keeps_its_constructor_and_computes_on_first_read() -> None:
    assert Rendered("ab", (0, -1), (3, 4), "t.jinja", "template x") == Rendered(
        text="ab", message_index=(0, -1), source_line=(3, 4), source_path="t.jinja", origin="template x")
    calls: list[int] = []

    def provenance() -> tuple[tuple[int, ...], tuple[int, ...]]:
        calls.append(1)
        return (0, -1), (3, 4)

    lazy = Rendered(text="ab", source_path="t.jinja", origin="template x", provenance=provenance)
    assert (lazy.provenance_computed, calls) == (False, [])
    assert lazy.source_line == (3, 4) and lazy.message_index == (0, -1) and lazy.source_line == (3, 4)
    assert (lazy.provenance_computed, calls, lazy.provenance) == (True, [1], None)
    assert lazy == Rendered("ab", (0, -1), (3, 4), "t.jinja", "template x")
    # Pickled and deep-copied with the provenance computed (the function is a closure over a renderer).
    unread = Rendered(text="ab", source_path="t.jinja", origin="template x", provenance=provenance)
    assert pickle.loads(pickle.dumps(unread)).message_index == (0, -1)
    assert copy.deepcopy(unread).source_line == (3, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.message_index = (1, 1)  # type: ignore[misc]
    with pytest.raises(TypeError, match="message_index and source_line, or a provenance function"):
        Rendered("ab", source_path="t.jinja", origin="template x")


def _ticking_clock(monkeypatch: pytest.MonkeyPatch, renderer: JinjaRenderer) -> JinjaRenderer:
    """`strftime_now` in the renderer's own environment (each renderer builds one, as transformers does per template;
    its overlays share its globals) reads a clock that moves on every call, as a real clock would between two
    renders."""
    ticks = iter(range(1, 1000))
    monkeypatch.setitem(renderer._reference_environment.globals, "strftime_now", lambda _format: f"t{next(ticks)}")
    return renderer


def test_a_template_that_renders_differently_twice_says_so_when_provenance_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = "{% for m in messages %}{{ m.content }}{% endfor %}{{ strftime_now('%H:%M:%S') }}"
    renderer = _ticking_clock(monkeypatch, JinjaRenderer(source, model="qwen3.6+clock", source_path="clock.jinja"))
    rendered = renderer.render([{"role": "user", "content": "hi"}], None, add_generation_prompt=True)
    assert rendered.text == "hit1"
    with pytest.raises(RenderError) as caught:
        _ = rendered.message_index
    assert str(caught.value) == (
        "clock.jinja for model qwen3.6+clock rendered different text when run again to record which message and "
        "line produced each character (does it read the clock or use random?), so the prompt has no per-character "
        "provenance")


def test_the_bridge_turns_that_refusal_into_an_error_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    stock = load_model("qwen3.6")
    source = stock.renderer.inner._source + "{{ strftime_now('%H:%M:%S') }}"
    renderer = JinjaRenderer(source, model="qwen3.6", source_path="clock.jinja",
                             special_tokens=stock.renderer.inner._special_tokens)
    clock = dataclasses.replace(stock, renderer=_ticking_clock(monkeypatch, renderer))
    cell = run_cell_with(clock, "tool-call", "bridge", {})
    assert cell.status == "error"
    assert cell.note is not None and cell.note.startswith("clock.jinja for model qwen3.6 rendered different text")


def test_render_cache_keys_tell_apart_what_renders_differently() -> None:
    base = [{"role": "user", "content": "hi", "n": 1}]
    variants = [
        [{"role": "user", "content": "hi", "n": 1.0}],
        [{"role": "user", "content": "hi", "n": True}],
        [{"content": "hi", "role": "user", "n": 1}],  # key order: templates iterate mappings in order
        [{"role": "user", "content": "hi", "n": (1,)}],
        [{"role": "user", "content": "hi", "n": [1]}],
        [{"role": "user", "content": "hi ", "n": 1}],
    ]
    keys = {request_key(m, None, True, None) for m in [base, *variants]}
    assert len(keys) == 1 + len(variants)
    assert request_key(base, None, True, None) != request_key(base, None, False, None)
    assert request_key(base, None, True, None) != request_key(base, [], True, None)
    # Equal requests give equal keys whether or not they share objects.
    text = "x" * 50
    shared = [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    copied = [{"role": "user", "content": "x" * 50}, {"role": "assistant", "content": "".join(["x"] * 50)}]
    assert request_key(shared, None, True, None) == request_key(copied, None, True, None)
    # What pickle refuses still gets a key (its repr).
    assert isinstance(request_key([{"role": "user", "content": lambda: 1}], None, True, None), str)
