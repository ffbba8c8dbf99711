"""`python -m engine fuzz`: break rates of random agent conversations, with 95% confidence intervals.

Each conversation is a scenario like those in `scenarios/`, drawn at random from the seed and its index alone
(so the result does not depend on how many workers share the work): reasoning, content and tool-call arguments of
every JSON type, whitespace variants, markup-like text and truncations, written by the model's own output format
and run through the real simulator (real template, real tokenizer, the engine's parser emulation). Conversations
are spread over processes; the JSON holds only what the seed determines (timings go to stderr).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TextIO

from engine.errors import ExplorerError
from engine.formats import get_format
from engine.formats.base import AssistantTurn, Knobs, ToolCallSpec
from engine.scenario import Scenario, ScriptTurn, tool_library
from engine.serving.spec import EngineSpec

if TYPE_CHECKING:
    from engine.simulate import CellResult

Z_95 = 1.959963984540054

WORDS = (
    "the", "weather", "city", "check", "result", "tool", "user", "asked", "for", "a", "search", "query", "number",
    "I", "should", "call", "then", "answer", "with", "data", "file", "path", "value", "maybe", "not", "sure",
    "Paris", "Rome", "Zürich", "São", "Paulo", "naïve", "café", "東京", "北京", "天气", "données", "😀", "🚀",
    "x=1", "f(x)", "a_b", "{\"k\": 1}", "[1, 2]", "'quoted'", "\"double\"", "back\\slash", "50%", "<b>", "&amp;",
    "--flag", "#tag", "@user", "http://example.com/a?b=c", "3.14", "-7", "1e-9", "TODO:", "...", "—", "…",
)
# Text that looks like a format's own markup: real models write it in content now and then.
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<arg_key>", "<|end|>",
          "<｜DSML｜", "<|tool_call_begin|>", "<parameter=x>")
WHITESPACE = (" ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", "\u3000")


@dataclass(frozen=True)
class FuzzOutcome:
    index: int
    status: str  # holds | breaks | error | unavailable
    roundtrips: int
    prompt_tokens: int | None  # tokens of the last prompt (None without a tokenizer)
    prompt_chars: int
    cause: tuple[str, str, str] | None  # (stage, kind, location) of the first break, or of an error
    origin: str = ""
    detail: str = ""


@dataclass(frozen=True)
class CauseRate:
    stage: str
    kind: str
    location: str
    origin: str
    count: int
    rate: float
    ci_low: float
    ci_high: float
    first_conversation: int
    first_detail: str


@dataclass
class FuzzReport:
    model: str
    engine: str
    n: int
    seed: int
    statuses: dict[str, int]
    roundtrips: int
    mean_prompt_tokens: float | None
    mean_prompt_chars: float
    break_rate: dict[str, float]  # rate, ci_low, ci_high of "breaks" over conversations that ran (not unavailable)
    error_rate: dict[str, float]  # the same for "error": the engine or the template refused a request
    causes: list[CauseRate]
    unavailable: str | None  # the sentence saying why conversations could not run, when some could not
    # Not in the JSON: they depend on the machine and the number of workers, not on the seed.
    workers: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds the conversations took (all workers): a figure that load on the machine bends less
    outcomes: list[FuzzOutcome] = field(default_factory=list, repr=False)

    @property
    def roundtrips_per_s(self) -> float:
        return self.roundtrips / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def roundtrips_per_cpu_s(self) -> float:
        return self.roundtrips / self.cpu_s if self.cpu_s else 0.0

    def to_json(self) -> dict:
        return {
            "model": self.model, "engine": self.engine, "n": self.n, "seed": self.seed,
            "statuses": self.statuses, "roundtrips": self.roundtrips,
            "mean_prompt_tokens": self.mean_prompt_tokens, "mean_prompt_chars": self.mean_prompt_chars,
            "break_rate": self.break_rate, "error_rate": self.error_rate,
            "causes": [c.__dict__ for c in self.causes],
            "unavailable": self.unavailable,
        }


def wilson(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (0..1); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


# ---- random conversations ---------------------------------------------------------------------------------------


def _text(rng: random.Random, words: int, markup: bool = True) -> str:
    out: list[str] = []
    for _ in range(words):
        if markup and rng.random() < 0.004:
            out.append(rng.choice(MARKUP))
        else:
            out.append(rng.choice(WORDS))
        out.append(" " if rng.random() < 0.9 else rng.choice(WHITESPACE))
    return "".join(out).strip(" ")


def _edges(rng: random.Random, text: str) -> str:
    """Whitespace variants at a text's edges: none most of the time, else spaces or newlines before/after."""
    if rng.random() < 0.25:
        text = rng.choice(WHITESPACE) + text
    if rng.random() < 0.25:
        text = text + rng.choice(WHITESPACE)
    return text


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(("string", "string", "integer", "number", "boolean", "null", "object", "array"))
    if depth >= 2 and kind in ("object", "array"):
        kind = "string"
    if kind == "string":
        return rng.choice(("", " ", _text(rng, rng.randint(1, 6), markup=False), "line one\nline two",
                           "tab\there", "quote \" and \\ backslash", "ünïcödé 中文 😀", "  padded  "))
    if kind == "integer":
        return rng.choice((0, 1, -1, 7, 42, 10**12, -(2**31), rng.randint(-1000, 1000)))
    if kind == "number":
        return rng.choice((0.0, 0.1, 1.5, -2.25, 1e-7, 3.0, 1e21, round(rng.uniform(-100, 100), rng.randint(0, 6))))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "object":
        return {rng.choice(("a", "b", "key", "nested", "ä", "k 1")): _json_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _arguments(rng: random.Random, tool: dict) -> dict[str, Any]:
    """Arguments for a declared tool: the schema's own types mostly, any JSON type now and then."""
    properties = tool["function"]["parameters"].get("properties", {})
    required = tool["function"]["parameters"].get("required", [])
    typed = {"string": lambda: _text(rng, rng.randint(1, 5), markup=False), "integer": lambda: rng.randint(-5, 500),
             "number": lambda: round(rng.uniform(0, 1), rng.randint(1, 4)), "boolean": lambda: rng.random() < 0.5,
             "object": lambda: _json_value(rng, 1) if rng.random() < 0.3 else {"k": _json_value(rng, 2)},
             "array": lambda: [_text(rng, 1, markup=False) for _ in range(rng.randint(0, 3))]}
    arguments: dict[str, Any] = {}
    for name, schema in properties.items():
        if name not in required and rng.random() < 0.5:
            continue
        if rng.random() < 0.15:
            arguments[name] = _json_value(rng)
        else:
            arguments[name] = typed.get(schema.get("type"), lambda: _json_value(rng))()
    return arguments


def _knobs(rng: random.Random, reasoning: bool, content: bool, arguments: bool) -> Knobs:
    if rng.random() < 0.45:
        return Knobs()
    changes: dict[str, Any] = {}
    if reasoning and rng.random() < 0.4:
        changes["reasoning_newlines_before"] = rng.choice((0, 1, 2))
        changes["reasoning_newlines_after"] = rng.choice((0, 1, 2, 3))
    if reasoning and rng.random() < 0.3:
        changes["newlines_after_think"] = rng.choice((0, 1, 2, 3))
    if reasoning and arguments and rng.random() < 0.1:
        changes["close_think"] = False
    if arguments and rng.random() < 0.4:
        changes["args_json"] = rng.choice(("compact", "spaced", "sorted", "ascii"))
    parts = [p for p, present in (("reasoning", reasoning), ("content", content), ("arguments", arguments)) if present]
    if parts and rng.random() < 0.15:
        changes["truncate_in"] = rng.choice(parts)
        changes["truncate_keep"] = round(rng.uniform(0.05, 0.95), 2)
    return Knobs(**changes)


def random_scenario(model_family: str, seed: int, index: int, target_words: int = 420) -> Scenario:
    """Conversation `index` of `seed`: a function of those two numbers and the output family alone."""
    rng = random.Random(f"drift-fuzz:{seed}:{index}")
    library = tool_library()
    tools = [library[name] for name in sorted(library)]
    fmt = get_format(model_family)
    one_call_per_turn = model_family == "harmony"  # harmony stops at the first call's <|call|>
    assistant_turns = rng.randint(1, 3)
    words = max(8, target_words // (2 + 2 * assistant_turns))
    turns: list[ScriptTurn] = [ScriptTurn("user", text=_edges(rng, _text(rng, rng.randint(words // 2, words))))]
    for _ in range(assistant_turns):
        reasoning = _edges(rng, _text(rng, rng.randint(words // 2, words))) if rng.random() < 0.85 else None
        calls: list[ToolCallSpec] = []
        if rng.random() < 0.6:
            for _ in range(1 if one_call_per_turn else rng.choice((1, 1, 1, 2))):
                tool = rng.choice(tools)
                calls.append(ToolCallSpec(tool["function"]["name"], _arguments(rng, tool)))
        content = "" if calls and rng.random() < 0.6 else _edges(rng, _text(rng, rng.randint(1, words)))
        knobs = _knobs(rng, reasoning is not None, bool(content), any(c.arguments for c in calls))
        turn = AssistantTurn(reasoning=reasoning, content=content, tool_calls=tuple(calls), knobs=knobs)
        try:
            fmt.write(turn, "")
        except (KeyError, ValueError):  # this family has no such part to cut in (harmony: content beside a call)
            turn = replace(turn, knobs=replace(knobs, truncate_in=None))
        turns.append(ScriptTurn("assistant", assistant=turn, noncanonical_tokens=rng.random() < 0.05))
        if calls and not knobs.truncate_in:
            turns += [ScriptTurn("tool", text=_edges(rng, _text(rng, rng.randint(2, words // 2)))) for _ in calls]
        else:
            turns.append(ScriptTurn("user", text=_edges(rng, _text(rng, rng.randint(2, words // 2)))))
    system = _text(rng, rng.randint(5, words)) if rng.random() < 0.7 else None
    calls_made = any(t.assistant.tool_calls for t in turns if t.assistant)
    declared = tools if calls_made or rng.random() < 0.8 else None  # no tools at all, now and then
    return Scenario(id=f"fuzz-{seed}-{index}", description=f"random conversation {index} of seed {seed}",
                    tools=declared, system=system, turns=tuple(turns),
                    source=f"engine/fuzz.py seed {seed} index {index}")


# ---- running ------------------------------------------------------------------------------------------------------

_JOB: dict[str, Any] = {}


def _init_worker(model_id: str, engine: EngineSpec, seed: int) -> None:
    _JOB.update(model_id=model_id, engine=engine, seed=seed)


def run_one(model_id: str, engine: EngineSpec | str, seed: int, index: int) -> FuzzOutcome:
    """One conversation through the simulator; never raises (a crash becomes an error outcome naming it)."""
    from engine.models import load_model
    from engine.simulate import run_cell_with

    model = load_model(model_id)
    try:
        scenario = random_scenario(model.spec.family, seed, index)
        # The cause, not its fix hint: the hint re-runs the conversation once per kwarg and engine.
        cell = run_cell_with(model, scenario, engine, {}, hints=False)
    except Exception as err:  # noqa: BLE001 - one bad conversation must not end a run of thousands
        return FuzzOutcome(index, "error", 0, None, 0, ("crash", type(err).__name__, ""), "",
                           f"conversation {index} crashed the simulator: {type(err).__name__}: {err}")
    last = cell.boundaries[-1] if cell.boundaries else None
    tokens = len(last.next_ids) if last is not None and last.next_ids is not None else None
    chars = len(last.next_prompt.text) if last is not None else 0
    cause = origin = detail = None
    if cell.cause is not None:
        cause = (cell.cause.stage, cell.cause.kind, str(cell.cause.location))
        origin, detail = cell.cause.origin, cell.cause.detail
    elif cell.status == "error":
        head = (cell.note or "").split(":", 1)[0]
        cause, detail = ("error", "request-failed", head), cell.note or ""
    return FuzzOutcome(index, cell.status, len(cell.boundaries), tokens, chars, cause, origin or "",
                       (detail or "")[:200] if cell.status != "unavailable" else cell.note or "")


def _run_index(index: int) -> FuzzOutcome:
    return run_one(_JOB["model_id"], _JOB["engine"], _JOB["seed"], index)


def _check_inputs(model_id: str, engine: str) -> EngineSpec:
    """The engine parsed once (raw, bridge or a vLLM / SGLang release the registry serves), after the model."""
    from engine.models import load_spec
    from engine.serving.registry import get_engine, parse_engine

    load_spec(model_id)  # raises ExplorerError naming the known models
    try:
        spec = parse_engine(engine)
        if spec.kind not in ("raw", "bridge"):
            get_engine(spec)
    except ValueError as err:
        raise ExplorerError(f"fuzz: {err}") from err
    return spec


def _rate(k: int, n: int) -> dict[str, float]:
    low, high = wilson(k, n)
    return {"rate": round(k / n, 6) if n else 0.0, "ci_low": round(low, 6), "ci_high": round(high, 6)}


def summarize(model_id: str, engine: str, n: int, seed: int, outcomes: list[FuzzOutcome]) -> FuzzReport:
    statuses = Counter(o.status for o in outcomes)
    ran = [o for o in outcomes if o.status != "unavailable"]
    by_cause: dict[tuple[str, str, str], list[FuzzOutcome]] = {}
    for outcome in ran:
        if outcome.cause is not None:
            by_cause.setdefault(outcome.cause, []).append(outcome)
    causes = []
    for key, hits in sorted(by_cause.items(), key=lambda item: (-len(item[1]), item[0])):
        low, high = wilson(len(hits), len(ran))
        causes.append(CauseRate(key[0], key[1], key[2], hits[0].origin, len(hits), round(len(hits) / len(ran), 6),
                                round(low, 6), round(high, 6), hits[0].index, hits[0].detail))
    tokens = [o.prompt_tokens for o in ran if o.prompt_tokens is not None]
    unavailable = next((o.detail for o in outcomes if o.status == "unavailable"), None)
    if unavailable:
        unavailable = f"{statuses['unavailable']} of {n} conversations could not run on {engine}: {unavailable}"
    return FuzzReport(
        model=model_id, engine=engine, n=n, seed=seed,
        statuses={s: statuses.get(s, 0) for s in ("holds", "breaks", "error", "unavailable")},
        roundtrips=sum(o.roundtrips for o in ran),
        mean_prompt_tokens=round(sum(tokens) / len(tokens), 2) if tokens else None,
        mean_prompt_chars=round(sum(o.prompt_chars for o in ran) / len(ran), 2) if ran else 0.0,
        break_rate=_rate(statuses["breaks"], len(ran)),
        error_rate=_rate(statuses["error"], len(ran)),
        causes=causes, unavailable=unavailable, outcomes=outcomes,
    )


def run_fuzz(model_id: str, engine: str, n: int, seed: int, workers: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> FuzzReport:
    """N random conversations on `workers` processes (default: every core); same seed, same report."""
    if n < 1:
        raise ExplorerError(f"fuzz: --n must be at least 1, got {n}")
    spec = _check_inputs(model_id, engine)
    from engine.models import load_model

    load_model(model_id)  # loaded once here; forked workers inherit it
    workers = max(1, min(workers or os.cpu_count() or 1, n))
    start, cpu_start = time.perf_counter(), os.times()
    outcomes: list[FuzzOutcome] = []
    if workers == 1:
        _init_worker(model_id, spec, seed)
        for index in range(n):
            outcomes.append(_run_index(index))
            if progress:
                progress(len(outcomes), n)
    else:
        import multiprocessing

        # HF tokenizers disables (and warns about) its thread pool in a forked child if the parent used it.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        chunk = max(1, min(64, n // (workers * 8)))
        with context.Pool(workers, initializer=_init_worker, initargs=(model_id, spec, seed)) as pool:
            for outcome in pool.imap_unordered(_run_index, range(n), chunksize=chunk):
                outcomes.append(outcome)
                if progress:
                    progress(len(outcomes), n)
    elapsed, cpu_end = time.perf_counter() - start, os.times()
    # In-process CPU for one worker; the reaped pool workers' CPU (children) otherwise.
    cpu = (cpu_end.user - cpu_start.user + cpu_end.system - cpu_start.system) if workers == 1 else \
        (cpu_end.children_user - cpu_start.children_user + cpu_end.children_system - cpu_start.children_system)
    outcomes.sort(key=lambda o: o.index)
    report = summarize(model_id, engine, n, seed, outcomes)
    report.workers, report.elapsed_s, report.cpu_s = workers, elapsed, cpu
    return report


def stderr_progress(stream: TextIO | None = None) -> Callable[[int, int], None]:
    """Progress on stderr: one line rewritten in place on a terminal; otherwise (a log, a pipe, CI) whole lines,
    each ending in a newline and at most one every 2 s, so that they never run together."""
    out = stream or sys.stderr
    tty = out.isatty()
    every = 0.5 if tty else 2.0
    state = {"last": 0.0, "start": time.perf_counter()}

    def show(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - state["last"] >= every:
            state["last"] = now
            line = f"fuzz: {done}/{total} conversations, {now - state['start']:.1f} s"
            if tty:
                print(f"\r{line}", end="\n" if done == total else "", file=out, flush=True)
            else:
                print(line, file=out, flush=True)

    return show


def conversation(model_id: str, engine: str, seed: int, index: int) -> tuple[Scenario, CellResult]:
    """Conversation `index` of a run with `seed` (the report's "e.g. conversation N") and its cell, to look at."""
    from engine.models import load_model
    from engine.simulate import run_cell_with

    spec = _check_inputs(model_id, engine)
    model = load_model(model_id)
    scenario = random_scenario(model.spec.family, seed, index)
    return scenario, run_cell_with(model, scenario, spec, {})


def conversation_text(scenario: Scenario, cell: CellResult) -> str:
    """The conversation turn by turn (whitespace made visible), then the cell's status and cause."""
    def shown(text: str) -> str:
        return text.replace("\n", "↵")

    lines = [f"# {scenario.description} ({scenario.source})", f"tools: {len(scenario.tools or [])} declared"]
    if scenario.system:
        lines.append(f"system: {shown(scenario.system)}")
    for turn in scenario.turns:
        if turn.assistant is None:
            lines.append(f"{turn.role}: {shown(turn.text)}")
            continue
        a = turn.assistant
        lines.append("assistant:" + (f" [{a.knobs.describe()}]" if a.knobs.describe() else "")
                     + (" [non-canonical tokens]" if turn.noncanonical_tokens else ""))
        if a.reasoning is not None:
            lines.append(f"  reasoning: {shown(a.reasoning)}")
        if a.content:
            lines.append(f"  content: {shown(a.content)}")
        for call in a.tool_calls:
            lines.append(f"  tool call: {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
    lines.append(f"result: {cell.status} through {cell.engine}" + (f"@{cell.engine_version}" if cell.engine_version
                                                                    else ""))
    if cell.cause is not None:
        lines.append(f"cause: {cell.cause.stage} {cell.cause.kind} at {cell.cause.location} ({cell.cause.origin}): "
                     f"{cell.cause.detail}")
    elif cell.note:
        lines.append(f"note: {cell.note}")
    return "\n".join(lines)


def report_text(r: FuzzReport) -> str:
    rate, errors = r.break_rate, r.error_rate
    lines = [
        f"# fuzz {r.model} · {r.engine} · n={r.n} · seed={r.seed}",
        "conversations: " + ", ".join(f"{k} {v}" for k, v in r.statuses.items()),
        f"roundtrips: {r.roundtrips}; last prompt: mean {r.mean_prompt_tokens} tokens, {r.mean_prompt_chars} chars",
        f"break rate: {rate['rate']:.2%} (95% CI {rate['ci_low']:.2%}-{rate['ci_high']:.2%}); requests refused: "
        f"{errors['rate']:.2%} (95% CI {errors['ci_low']:.2%}-{errors['ci_high']:.2%})",
        "by cause (share of conversations, 95% CI, count):",
    ]
    for c in r.causes:
        lines.append(f"  {c.rate:7.2%} [{c.ci_low:.2%}-{c.ci_high:.2%}] {c.count:>5}  {c.stage} {c.kind} at "
                     f"{c.location or '?'} ({c.origin}); e.g. conversation {c.first_conversation}")
    if r.causes:
        lines.append(f"see one: python -m engine fuzz --model {r.model} --engine {r.engine} --seed {r.seed} "
                     f"--show {r.causes[0].first_conversation}")
    if r.unavailable:
        lines.append(r.unavailable)
    return "\n".join(lines)
