"""The incremental text render (engine.render.incremental) gives exactly the full render's text.

Every plain text render of a Jinja template goes through the incremental path; here each one is also rendered in
full through the same compiled template and the two texts must be equal: every request of every session in
scenarios/sessions/ and of long generated sessions (with a follow-up question, where Qwen's `last_query_index`
moves and every earlier turn loses its reasoning), through the template's own history and append-only; every request
of the default matrix; grown, edited, shortened and reordered histories for every Jinja model; and templates written
to break a shortcut (reads of loop.last, nextitem, messages[i + 1], messages[-1], the length, namespace state
written late). Templates outside the class name the reason, and the renders that could not be recorded fall back.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conversations import CONVERSATIONS, TOOLS

from engine.bench import clear_run_caches, long_session_script
from engine.errors import ExplorerError, RenderError
from engine.matrix import default_request, run_matrix
from engine.models import load_model, load_spec, model_ids
from engine.prefix import common_prefix
from engine.render.jinja import JinjaRenderer
from engine.session import (
    StepRewrite,
    _request_input,
    load_session,
    session_from_json,
    session_ids,
    simulate_session,
)

# From the models' specs, not by loading each one: collecting the suite loads no tokenizer
# (test_jinja_models_are_the_models_whose_loaded_renderer_is_jinja checks that both agree).
JINJA_MODELS = [m for m in model_ids() if load_spec(m).renderer == "jinja"]
# Outside the class, and why (the whole template renders in full); every other Jinja model memoises its loops.
REFUSED = {"llama-3.1": "line 18 assigns `messages`"}
# The main loop's body reads, by name, the list the template sliced from `messages` for it to iterate (GPT-OSS:
# `loop_messages[loop.index:]`, whether a final answer follows; MiniMax: `conversation_messages`): an outer name whose
# value grows at every request, so that loop runs whole.
LOOKS_AHEAD = {"gpt-oss", "minimax-m2.7"}


def inner(model_id: str) -> JinjaRenderer:
    model = load_model(model_id)
    return getattr(model.renderer, "inner", model.renderer)


class Compared:
    """Wraps a renderer's `render`: each plain render also rendered in full, the texts compared."""

    def __init__(self, renderer: JinjaRenderer) -> None:
        self.renderer = renderer
        self.renders = 0  # asked for
        self.compared = 0  # rendered, and compared with the full render (the others raised in both)
        self.mismatches: list[str] = []
        self.known: list[tuple[str, str, int]] = []  # (previous text, text, the prefix the render says they share)

    def __call__(self, messages, tools, *, add_generation_prompt, kwargs=None):
        renderer = self.renderer
        self.renders += 1
        try:
            rendered = JinjaRenderer.render(renderer, messages, tools, add_generation_prompt=add_generation_prompt,
                                            kwargs=kwargs)
        except RenderError as err:  # the template refuses these messages: so does the full render
            chat, variables = renderer.template_context(messages, tools, add_generation_prompt, kwargs)
            with pytest.raises(Exception) as full_error:  # noqa: B017, PT011 (whatever it raises, as RenderError says)
                renderer._text_template.render(messages=chat, **variables)
            assert str(full_error.value) in str(err)
            raise
        chat, variables = renderer.template_context(messages, tools, add_generation_prompt, kwargs)
        full = renderer._text_template.render(messages=chat, **variables)
        self.compared += 1
        where = f"{renderer.model}: render {self.renders} ({len(messages)} messages, generation prompt " \
            f"{add_generation_prompt}, kwargs {kwargs})"
        if rendered.text != full and len(self.mismatches) < 3:
            self.mismatches.append(f"{where} differs from the full render")
        if rendered.known_prefix is not None:  # what it says it shares with the previous render, it shares
            previous, known = str(rendered.known_prefix[0]), rendered.known_prefix[1]
            self.known.append((previous, rendered.text, known))
            if not (0 <= known <= min(len(previous), len(rendered.text)) and
                    rendered.text[:known] == previous[:known]) and len(self.mismatches) < 3:
                self.mismatches.append(f"{where} does not share the {known} characters it says it does")
        return rendered


@contextmanager
def compared(model_ids_: list[str]) -> Iterator[dict[str, Compared]]:
    wrappers = {}
    clear_run_caches(tuple(model_ids_))  # the matrix's cells too: an earlier test may have run them
    for model_id in model_ids_:
        renderer = inner(model_id)
        wrappers[model_id] = renderer.render = Compared(renderer)  # instance attribute, removed below
    try:
        yield wrappers
    finally:
        for model_id in model_ids_:
            del inner(model_id).render
        clear_run_caches(tuple(model_ids_))


def render_requests(model_id: str, script, rewrites=()) -> None:
    """Each request of a session as `simulate_session` renders it through the template: the prompt, then the
    sequence with the reply."""
    renderer = load_model(model_id).renderer
    for n, step in enumerate(script.request_steps, start=1):
        messages, tools = _request_input(script, n, step, rewrites)
        reply = next((m for m in script.steps[step + 1:] if m["role"] == "assistant"), None)
        for history, generation_prompt in ((messages, True), (messages + [reply], False)):
            if generation_prompt or reply:
                with contextlib.suppress(RenderError):  # Mistral's template refuses the scripts' call ids
                    renderer.render(history, tools, add_generation_prompt=generation_prompt)


def assert_equal(wrappers: dict[str, Compared]) -> None:
    problems = [m for w in wrappers.values() for m in w.mismatches]
    assert problems == []
    assert all(w.compared for w in wrappers.values())


def test_jinja_models_are_the_models_whose_loaded_renderer_is_jinja() -> None:
    loaded = [m for m in model_ids() if isinstance(inner(m), JinjaRenderer)]
    assert JINJA_MODELS == loaded
    assert {"qwen3.6", "llama-3.1"} <= set(loaded) and "deepseek-v4" not in loaded


def test_templates_outside_the_class_say_why() -> None:
    refused = {m: inner(m)._incremental.refusal for m in JINJA_MODELS if inner(m)._incremental.refusal}
    assert refused == REFUSED
    for model_id in set(JINJA_MODELS) - set(REFUSED):
        assert inner(model_id)._incremental.loops, model_id
    assert inner("qwen3.6").incremental_stats()["refusal"] is None


@pytest.mark.parametrize("model_id", JINJA_MODELS)
def test_every_session_request_renders_as_the_full_render(model_id: str) -> None:
    scripts = [load_session(name) for name in session_ids()]
    scripts += [session_from_json(long_session_script(24, follow_up=follow), "long") for follow in (False, True)]
    long = session_from_json(long_session_script(12, follow_up=True), "long")
    rewrite = (StepRewrite(5, 4, "summarised"),)
    model = load_model(model_id)
    with compared([model_id]) as wrappers:
        for script in scripts:
            if model.tokenizer is None:  # the simulator needs one: the requests it would render, rendered
                render_requests(model_id, script)
                continue
            with contextlib.suppress(RenderError):  # Mistral's template refuses the scripts' call ids
                simulate_session(model, script)
            with contextlib.suppress(ExplorerError):  # and MiniMax's cannot keep an append-only history
                simulate_session(model, script, history="append")
        if model.tokenizer is None:
            render_requests(model_id, long, rewrite)
        else:
            with contextlib.suppress(RenderError):
                simulate_session(model, long, rewrites=rewrite)
        stats = inner(model_id).incremental_stats()
    assert_equal(wrappers)
    print(model_id, stats)
    if model_id in REFUSED:
        assert stats["renders"] == 0
    else:
        assert stats["fell_back"] == 0
        if model_id not in LOOKS_AHEAD:
            assert stats["iterations_replayed"] > 5 * stats["iterations_executed"] > 0


@pytest.mark.parametrize("model_id", ["qwen3.6", "glm-5.1"])
def test_a_render_knows_what_it_shares_with_the_previous_one_up_to_the_last_turn(model_id: str) -> None:
    """Each request of a long session says how many characters it shares with the render before it, from the
    pieces both are made of: so the simulator compares what is new, not the history. What it leaves to compare is
    the same at every request: the generation prompt a sequence's reply repeats, nothing of a sequence a prompt
    extends."""
    calls = 30
    script = session_from_json(long_session_script(calls), "long")
    model = load_model(model_id)
    messages, tools = _request_input(script, 1, script.request_steps[0], ())
    without, with_prompt = (model.renderer.render(messages, tools, add_generation_prompt=g).text for g in (False, True))
    generation_prompt = with_prompt[len(without):]
    with compared([model_id]) as wrappers:
        simulate_session(model, script)
    assert_equal(wrappers)
    known = wrappers[model_id].known
    assert len(known) == 2 * calls + 1  # every render but the first: 31 prompts, then 30 sequences
    unknown = [common_prefix(previous, text) - agreed for previous, text, agreed in known]
    assert unknown == [len(generation_prompt), 0] * calls + [len(generation_prompt)]
    assert len(generation_prompt) == {"qwen3.6": 30, "glm-5.1": 20}[model_id]


def test_default_matrix_renders_as_the_full_render() -> None:
    request = default_request()
    with compared([m for m in request.models if m in JINJA_MODELS]) as wrappers:
        run_matrix(request)
    assert_equal(wrappers)


def _histories(messages: list[dict]) -> list[list[dict]]:
    """The conversation grown a message at a time, then edited behind the last request, shortened, reordered, and
    sent again as equal but new objects."""
    grown = [messages[:k] for k in range(1, len(messages) + 1)]
    edited = copy.deepcopy(messages)
    for message in edited[:-1]:
        if isinstance(message.get("content"), str):
            message["content"] += " (edited)"
            break
    out = grown + [edited, messages, messages[:-1], messages[:1], messages, list(reversed(messages)), messages,
                   copy.deepcopy(messages), messages + messages[1:], messages]
    if len(messages) > 2:
        out += [messages[:1] + messages[2:], messages]
    return out


@pytest.mark.parametrize("model_id", JINJA_MODELS)
def test_grown_edited_and_shortened_histories_render_as_the_full_render(model_id: str) -> None:
    from test_render import KWARG_VARIANTS

    renderer = inner(model_id)
    with compared([model_id]) as wrappers:
        for kwargs in KWARG_VARIANTS.get(model_id, [{}]):
            for messages, tools in CONVERSATIONS.values():
                for history in _histories(messages):
                    for tools_now in (tools, None, TOOLS):
                        for generation_prompt in (True, False):
                            with contextlib.suppress(RenderError):  # refused in full too (Compared)
                                renderer.render(history, tools_now, add_generation_prompt=generation_prompt,
                                                kwargs=kwargs)
    assert wrappers[model_id].mismatches == []


# Templates written against the shortcut: each reads something that changes an earlier message's text when later
# messages arrive or earlier ones change.
ADVERSARIAL = {
    "last": "{% for m in messages %}{{ m.content }}{% if loop.last %}[last]{% endif %}|{% endfor %}",
    "nextitem": "{% for m in messages %}{{ m.content }}{% if loop.nextitem %}>{{ loop.nextitem.role }}{% endif %}|"
                "{% endfor %}",
    "previtem": "{% for m in messages %}{% if loop.previtem %}<{{ loop.previtem.content }}{% endif %}{{ m.content }}"
                "|{% endfor %}",
    "next by index": "{% for m in messages %}{{ m.content }}{% if not loop.last %}~{{ messages[loop.index0 + 1].role }}"
                     "{% endif %}|{% endfor %}",
    "last by index": "{% for m in messages %}{{ m.content }}{% if m is sameas messages[-1] %}!{% endif %}|{% endfor %}",
    "length": "{% for m in messages %}{{ m.content }}/{{ messages|length }}|{% endfor %}",
    "revindex": "{% for m in messages %}{{ m.content }}{{ loop.revindex }}{{ loop.length }}|{% endfor %}",
    "first": "{% for m in messages[::-1] %}{% if loop.first %}*{% endif %}{{ m.content }}{{ loop.index }}|{% endfor %}",
    "namespace written late": "{% set ns = namespace(last_user=-1, seen='') %}"
                              "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}"
                              "{% endif %}{% endfor %}"
                              "{% for m in messages %}{% if loop.index0 > ns.last_user %}({{ m.content }}){% else %}"
                              "{{ m.content }}{% endif %}{% set ns.seen = ns.seen ~ m.role[0] %}{{ ns.seen|length }}|"
                              "{% endfor %}{{ ns.seen }}",
    "backward scan": "{% set ns = namespace(multi=true, q=messages|length - 1) %}"
                     "{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
                     "{% if ns.multi and m.role == 'user' %}{% set ns.multi = false %}{% set ns.q = index %}{% endif %}"
                     "{% endfor %}{% for m in messages %}{% if loop.index0 > ns.q %}+{% endif %}{{ m.content }}|"
                     "{% endfor %}",
    "backward index0": "{% set ns = namespace(k=0) %}{% for m in messages[::-1] %}{% if m.role == 'user' %}"
                       "{% set ns.k = loop.index0 %}{% endif %}{% endfor %}{{ ns.k }}"
                       "{% for m in messages %}{{ m.content }}{% endfor %}",
    "macro writes a namespace": "{% set count = namespace(n=0) %}{% macro tick(m) %}{% if m.role == 'user' %}"
                                "{% set count.n = count.n + 1 %}{% endif %}{{ count.n }}{% endmacro %}"
                                "{% for m in messages %}{{ tick(m) }}{{ m.content }}|{% endfor %}",
    "conditional set": "{% for m in messages %}{% if m.role == 'user' %}{% set note = m.content %}{% endif %}"
                       "[{{ note }}]{% endfor %}",
    "outer variable": "{% set greeting = messages[0].content %}{% for m in messages %}{{ greeting }}:{{ m.content }}"
                      "{% endfor %}",
    "tool flag": "{% for m in messages %}{% if tools %}T{% endif %}{{ m.content }}{% endfor %}",
    "stateful outer object": "{% set sep = joiner('/') %}{% for m in messages %}{{ sep() }}{{ m.content }}"
                             "{% endfor %}",
    "macro through a variable": "{% macro shout(m) %}{{ m.content|upper }}{{ messages|join }}{% endmacro %}"
                                "{% set say = shout %}{% for m in messages %}{{ say(m) }}{% endfor %}",
    "macro in a namespace": "{% macro shout(m) %}{{ m.content|upper }}{% endmacro %}{% set ns = namespace(f=none) %}"
                            "{% set ns.f = shout %}{% for m in messages %}{{ ns.f(m) }}{% endfor %}",
    "printed namespace": "{% set ns = namespace(a=1) %}{% for m in messages %}{{ ns }}{{ m.content }}{% endfor %}",
    "new attribute": "{% set ns = namespace() %}{% for m in messages %}{% if ns.x is defined %}x{% endif %}"
                     "{% if m.role == 'assistant' %}{% set ns.x = 1 %}{% endif %}{{ m.content }}{% endfor %}",
}
# Outside the class: the template renders in full, and says why.
ADVERSARIAL_REFUSED = {
    "cycle": "{% for m in messages %}{{ loop.cycle('a', 'b') }}{{ m.content }}{% endfor %}",
    "changed": "{% for m in messages %}{% if loop.changed(m.role) %}#{% endif %}{{ m.content }}{% endfor %}",
    "joiner": "{% for m in messages %}{% set sep = joiner('/') %}{{ sep() }}{{ m.content }}{% endfor %}",
    "break": "{% for m in messages %}{% if m.role == 'tool' %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
    "whole list": "{% for m in messages %}{{ messages|map(attribute='role')|join(',') }}{{ m.content }}{% endfor %}",
    "loop passed on": "{% macro show(l) %}{{ l.index }}{% endmacro %}{% for m in messages %}{{ show(loop) }}"
                      "{% endfor %}",
    "reassigned": "{% set messages = messages[1:] %}{% for m in messages %}{{ m.content }}{% endfor %}",
}


def _conversation() -> list[dict]:
    messages, _ = CONVERSATIONS["full-round-next-user"]
    return [{"role": "system", "content": "sys"}] + messages + [
        {"role": "assistant", "content": "Sure."}, {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
        {"role": "user", "content": "last"}]


@pytest.mark.parametrize("name", sorted(ADVERSARIAL) + sorted(ADVERSARIAL_REFUSED))
def test_templates_written_against_the_shortcut_render_as_the_full_render(name: str) -> None:
    source = ADVERSARIAL.get(name) or ADVERSARIAL_REFUSED[name]
    renderer = JinjaRenderer(source, model="adversarial", source_path=f"{name}.jinja")
    wrapper = Compared(renderer)
    renderer.render = wrapper
    for history in _histories(_conversation()) + _histories(_conversation()[1:]):
        for tools in (None, TOOLS):
            wrapper(history, tools, add_generation_prompt=False)
    assert wrapper.mismatches == []
    stats = renderer.incremental_stats()
    if name in ADVERSARIAL_REFUSED:
        assert stats["refusal"] and stats["renders"] == 0
    elif name in ("printed namespace", "macro through a variable", "macro in a namespace"):
        assert stats["refusal"] is None and stats["fell_back"] == stats["renders"] > 0
    elif name == "stateful outer object":  # a new joiner at every render: never the same outer value
        assert stats["refusal"] is None and stats["iterations_replayed"] == 0 < stats["iterations_executed"]
    else:
        assert stats["refusal"] is None and stats["fell_back"] == 0
        assert stats["iterations_replayed"] > 0


def test_threads_keep_their_own_records() -> None:
    """The web app renders from several threads: each keeps its own records and gets the full render's text."""
    renderer = inner("qwen3.6")
    load_model("qwen3.6").renderer.cache_clear()
    wrapper = Compared(renderer)
    scripts = [session_from_json(long_session_script(16, follow_up=f), "long") for f in (False, True)]
    errors: list[BaseException] = []

    def run(script) -> None:
        try:
            messages = [{"role": "system", "content": script.system}]
            for step in script.steps:
                messages = messages + [step]
                if step["role"] != "assistant":
                    wrapper(messages, script.tools, add_generation_prompt=True)
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=run, args=(s,)) for s in scripts * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrapper.mismatches == [] and wrapper.renders == 2 * sum(
        sum(1 for s in script.steps if s["role"] != "assistant") for script in scripts)
    load_model("qwen3.6").renderer.cache_clear()


def random_histories(seed: int, history: list[dict], pool: list[dict], steps: int) -> Iterator[list[dict]]:
    """A seeded random walk: messages appended, the history cut, an earlier message edited (a new object), the whole
    history copied, two messages after the first swapped."""
    import random

    rng = random.Random(seed)
    for _ in range(steps):
        move = rng.random()
        if move < 0.55:
            history = history + [rng.choice(pool)]
        elif move < 0.65 and len(history) > 2:
            history = history[:rng.randrange(1, len(history))]
        elif move < 0.8 and len(history) > 1:
            k = rng.randrange(len(history))
            history = history[:k] + [{**history[k], "content": f"{history[k].get('content') or ''} edit {k % 3}"}] + \
                history[k + 1:]
        elif move < 0.9:
            history = copy.deepcopy(history)
        elif len(history) > 3:
            k = rng.randrange(1, len(history) - 1)
            history = history[:k] + [history[k + 1], history[k]] + history[k + 2:]
        yield history


@pytest.mark.parametrize("model_id", ["qwen3.6", "glm-5.1", "deepseek-v3.2", "kimi-k2.6"])
def test_a_random_walk_of_histories_renders_as_the_full_render(model_id: str) -> None:
    """Appends, truncations, edits of earlier messages, equal copies and reorderings, with tools and the generation
    prompt switched at random: every render equals the full one."""
    pool = [m for m in [*(m for messages, _ in CONVERSATIONS.values() for m in messages), *_conversation()]
            if m["role"] != "system"]
    renderer = inner(model_id)
    start = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    with compared([model_id]) as wrappers:
        for k, history in enumerate(random_histories(19, start, pool, 400)):
            with contextlib.suppress(RenderError):  # refused in full too (Compared)
                renderer.render(history, TOOLS if k % 3 else None, add_generation_prompt=k % 5 < 3)
        stats = renderer.incremental_stats()
    assert wrappers[model_id].mismatches == [] and wrappers[model_id].renders == 400
    assert wrappers[model_id].compared > 150  # the rest the template refuses (a system message not first, ...)
    assert stats["iterations_replayed"] > stats["iterations_executed"]


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_a_random_walk_through_templates_written_against_the_shortcut(name: str) -> None:
    renderer = JinjaRenderer(ADVERSARIAL[name], model="adversarial", source_path=f"{name}.jinja")
    wrapper = Compared(renderer)
    pool = _conversation()
    for k, history in enumerate(random_histories(len(name), pool[:2], pool, 300)):
        wrapper(history, TOOLS if k % 2 else None, add_generation_prompt=False)
    assert wrapper.mismatches == [] and wrapper.compared == 300
