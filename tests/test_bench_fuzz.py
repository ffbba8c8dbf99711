"""The fuzzer (reproducible, every JSON type, causes as the simulator computes them) and the bench's contract.

No timing is asserted: only what the seed and the inputs determine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import growth_exponent, long_session_script
from engine.cli import main
from engine.fuzz import FuzzOutcome, random_scenario, run_fuzz, summarize, wilson
from engine.models import load_model, load_spec
from engine.scenario import scenario_ids
from engine.session import session_from_json, simulate_session
from engine.simulate import run_cell_with
from engine.watch.upstream import recorded_sessions

ROOT = Path(__file__).resolve().parent.parent


def test_same_seed_same_json_whatever_the_workers() -> None:
    one = run_fuzz("qwen3.6", "raw", 16, seed=3, workers=1).to_json()
    two = run_fuzz("qwen3.6", "raw", 16, seed=3, workers=2).to_json()
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)
    assert one["n"] == 16 and sum(one["statuses"].values()) == 16
    assert sum(c["count"] for c in one["causes"]) == one["statuses"]["breaks"] + one["statuses"]["error"]
    other = run_fuzz("qwen3.6", "raw", 16, seed=4, workers=1).to_json()
    assert other["causes"] != one["causes"] or other["roundtrips"] != one["roundtrips"]


def _types(value, into: set[str]) -> None:
    into.add(type(value).__name__)
    if isinstance(value, dict):
        for item in value.values():
            _types(item, into)
    elif isinstance(value, list):
        for item in value:
            _types(item, into)


def test_conversations_hold_every_json_type_whitespace_and_truncation() -> None:
    scenarios = [random_scenario("qwen3_xml", 0, i) for i in range(60)]
    assert random_scenario("qwen3_xml", 0, 7) == scenarios[7]
    assert random_scenario("qwen3_xml", 1, 7) != scenarios[7]
    types: set[str] = set()
    truncations: set[str] = set()
    edges = 0
    for scenario in scenarios:
        for turn in scenario.turns:
            if turn.assistant is None:
                edges += turn.text != turn.text.strip()
                continue
            for call in turn.assistant.tool_calls:
                _types(call.arguments, types)
            if turn.assistant.knobs.truncate_in:
                truncations.add(turn.assistant.knobs.truncate_in)
    assert types >= {"str", "int", "float", "bool", "NoneType", "dict", "list"}
    assert truncations == {"reasoning", "content", "arguments"}
    assert edges > 10


@pytest.mark.parametrize("engine", ["vllm", "raw"])
def test_fuzz_causes_are_the_simulators_own(engine: str) -> None:
    # hints=False drops only the fix hint: stage, kind and location are those of the full attribution.
    model = load_model("qwen3.6")
    compared = 0
    for index in range(12):
        scenario = random_scenario(model.spec.family, 11, index)
        fast = run_cell_with(model, scenario, engine, {}, hints=False)
        full = run_cell_with(model, scenario, engine, {})
        assert fast.status == full.status
        if full.cause is not None:
            compared += 1
            assert (fast.cause.stage, fast.cause.kind, str(fast.cause.location), fast.cause.detail) == (
                full.cause.stage, full.cause.kind, str(full.cause.location), full.cause.detail)
            assert fast.cause.fix is None and full.cause.fix is not None
    assert compared >= 6


def test_wilson_interval() -> None:
    assert tuple(round(x, 4) for x in wilson(5, 10)) == (0.2366, 0.7634)
    assert tuple(round(x, 4) for x in wilson(0, 10)) == (0.0, 0.2775)
    assert tuple(round(x, 4) for x in wilson(10, 10)) == (0.7225, 1.0)
    assert wilson(0, 0) == (0.0, 1.0)


def test_unavailable_conversations_are_counted_and_named_not_crashed() -> None:
    note = "parser 'glm47' is registered but not emulated yet"
    outcomes = [FuzzOutcome(0, "unavailable", 0, None, 0, None, "", note),
                FuzzOutcome(1, "holds", 2, 900, 3000, None),
                FuzzOutcome(2, "breaks", 1, 800, 2800, ("template", "reasoning-dropped", "t.jinja:3"), "template m",
                            "at char 9")]
    report = summarize("glm-5.1", "vllm", 3, 0, outcomes)
    assert report.statuses == {"holds": 1, "breaks": 1, "error": 0, "unavailable": 1}
    assert report.unavailable == f"1 of 3 conversations could not run on vllm: {note}"
    assert report.break_rate["rate"] == 0.5 and report.error_rate["rate"] == 0.0
    assert [(c.kind, c.count, c.rate, c.first_conversation) for c in report.causes] == [
        ("reasoning-dropped", 1, 0.5, 2)]
    assert report.mean_prompt_tokens == 850.0 and report.roundtrips == 3


@pytest.mark.parametrize(("argv", "message"), [
    (["fuzz", "--model", "qwen3.6", "--engine", "nope", "--n", "2"],
     "error: fuzz: unknown engine 'nope'; known: vllm@0.33.0, sglang@0.5.23, sglang@0.5.12, vllm, sglang, or any "
     "vllm@X / sglang@X release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1)\n"),
    (["fuzz", "--model", "qwen9", "--engine", "raw", "--n", "2"], "error: unknown model 'qwen9'"),
    (["fuzz", "--model", "qwen3.6", "--engine", "raw", "--n", "0"], "error: fuzz: --n must be at least 1, got 0\n"),
    (["bench", "--repeat", "0"], "error: bench: --repeat must be at least 1, got 0\n"),
])
def test_bad_input_is_one_sentence(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


def test_bench_json_contract() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engine", "bench", "--models", "qwen3.5", "--scenarios", "tool-call,no-tools-next-user",
         "--repeat", "1", "--long-session-calls", "2,8", "--long-session-models", "qwen3.5", "--watch-sessions", "4",
         "--watch-pacing", "10,2", "--json", "-"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)  # a bound, however loaded
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("cold_start_s", "matrix_s", "cell_median_ms", "floor_s", "ratio_to_floor", "naive_s",
                "speedup_vs_naive", "peak_rss_mb", "matrix_cold_s", "ratio_cold_to_floor", "matrix_without_causes_s",
                "matrix_causes_searched_s", "ratio_causes_searched_to_floor", "speedup_causes_searched_vs_naive"):
        assert isinstance(data[key], float) and data[key] > 0, key
    assert 0 <= data["blame_share"] < 1
    # The cold run's CPU: the explorer's, and each worker of a release the run asks; their total over the machine's
    # cores is the least wall it could take. Qwen3.5's vllm and sglang columns are the pinned emulations: only
    # sglang@0.5.12, which a fix hint re-runs a break on, runs its own code (engine.serving.registry.spawn_releases
    # starts no other).
    cpu = data["matrix_cold_cpu_s"]
    assert set(cpu) == {"explorer", "explorer_system", "workers", "total"}
    assert cpu["explorer"] > cpu["explorer_system"] > 0
    assert list(cpu["workers"]) == ["sglang@0.5.12"]
    assert all(seconds > 0 for seconds in cpu["workers"].values())
    assert cpu["total"] == pytest.approx(cpu["explorer"] + sum(cpu["workers"].values()), abs=0.002)
    assert data["cold_cpu_bound_s"] == pytest.approx(cpu["total"] / data["cpu_count"], abs=0.002)
    # (the ratio is of the unrounded figures)
    assert data["ratio_cold_cpu_bound_to_floor"] == pytest.approx(data["cold_cpu_bound_s"] / data["floor_s"], rel=0.01)
    # --repeat 1: one round, whose own ratios are the report's
    assert data["ratios_by_round"] == {"matrix_to_floor": [data["ratio_to_floor"]],
                                       "naive_to_matrix": [data["speedup_vs_naive"]],
                                       "cold_to_floor": [data["ratio_cold_to_floor"]]}
    # qwen3.5's pinned columns are the emulations, but blame's fix hint re-runs a breaking cell with sglang@0.5.12,
    # which runs its own code: the result cache is asked (how much it answers depends on what earlier runs kept),
    # nothing in it is rejected
    cache = data["result_cache"]
    assert cache["hits"] + cache["misses"] > 0 and cache["rejected"] == 0
    assert data["cells"] == 10  # 2 scenarios × vllm, sglang, raw, bridge, renderers
    assert data["naive_requests"] == data["render_calls"] and data["naive_cell_requests"] < data["naive_requests"]
    # the baseline's own process gave the ids of every distinct request, and each equals the matrix's
    assert data["naive_ids_compared"] == data["distinct_renders"] and data["naive_ids_differ"] == 0
    flipped = next(k for k in load_spec("qwen3.5").template_kwargs if isinstance(k.default, bool))
    assert data["toggle_kwargs"] == {"qwen3.5": f"{flipped.name}={'false' if flipped.default else 'true'}"}
    assert data["toggle_cells"] == 10
    assert data["segment_reuse"]["qwen3.5"].endswith("ids reused between added tokens (proven from its configuration)")
    # Engines share prompts and boundaries share prefixes: strings and pieces come back from the caches.
    stats = data["cache_stats"]["qwen3.5"]
    assert stats["string_misses"] == data["distinct_strings"] and stats["string_hits"] > 0
    assert stats["segment_hits"] > stats["segment_misses"]
    # Long sessions: one point per (model, calls), each from a fresh process, and the growth exponents.
    sessions = data["long_session"]
    assert (sessions["models"], sessions["calls"]) == (["qwen3.5"], [2, 8])
    assert [(p["model"], p["calls"], p["requests"]) for p in sessions["points"]] == [
        ("qwen3.5", 2, 3), ("qwen3.5", 8, 9)]
    script = session_from_json(long_session_script(8), "bench")
    assert sessions["points"][-1]["last_prompt_tokens"] == \
        simulate_session(load_model("qwen3.5"), script).rows[-1].prompt_tokens
    for point in sessions["points"]:
        assert 1 <= point["runs"] <= 20  # --repeat 1, and more of a short session, up to a second of them
        assert point["processes"] == 1  # --repeat 1: one fresh process (the default 3: the faster of two)
        assert set(point) == {"model", "calls", "requests", "last_prompt_tokens", "prompt_tokens", "runs", "processes",
                              "new_characters",
                              "new_tokens", "wall_s", "render_s", "floor_s", "ratio_to_floor",
                              "ratio_to_render_and_floor", "simulator_s", "simulator_ratio_to_floor", "peak_rss_mb",
                              "rss_after_loading_mb", "rss_with_report_mb", "incremental_render"}
        assert point["new_tokens"] < point["prompt_tokens"]  # the floor tokenizes what is new, not every prompt
        # Every render resumed the template's loops from the one before (engine.render.incremental).
        incremental = point["incremental_render"]
        assert incremental["refusal"] is None and incremental["fell_back"] == incremental["raised"] == 0
        assert incremental["renders"] == 2 * point["requests"]  # each request's prompt, and sequence with the reply
        assert all(isinstance(point[k], float) and point[k] > 0 for k in ("wall_s", "floor_s", "simulator_s",
                                                                           "peak_rss_mb"))
    assert sessions["points"][-1]["incremental_render"]["iterations_replayed"] > \
        sessions["points"][-1]["incremental_render"]["iterations_executed"]
    assert set(sessions["growth_exponent"]["qwen3.5"]) == {"wall", "render", "wall_without_render", "simulator",
                                                           "session_rss"}
    assert isinstance(sessions["growth_exponent"]["qwen3.5"]["wall"], float)
    # The watch: every request sent straight and through it, the same bytes back, each one recorded, and analysed
    # unless the analysis (SCHED_IDLE) had no free CPU time to catch up in.
    watch, samples = data["watch"], recorded_sessions(ROOT / "samples" / "traces" / "openai.jsonl")
    names = sorted(samples)
    requests = {(n, r): len(samples[names[(n + r) % len(names)]]) for n in range(4) for r in range(watch["rounds"])}
    assert watch["pairs"] == sum(v for (_, r), v in requests.items() if r > 0)  # round 0 warms up
    assert watch["recorded"] == watch["analysed"] + watch["analysis_queued_at_end"] == sum(requests.values())
    assert (watch["bodies_differ"], watch["statuses"], watch["dropped"]) == (0, ["200/200"], 0)
    assert watch["upstream_pacing"] == {"first_token_s": 0.01, "token_s": 0.002}


def test_bench_long_session_calls_are_checked(capsys) -> None:
    assert main(["bench", "--long-session-calls", "50,x"]) == 2
    assert capsys.readouterr().err == \
        "error: bench: --long-session-calls must be positive whole numbers or none, got '50,x'\n"
    assert main(["bench", "--watch-pacing", "100"]) == 2
    assert capsys.readouterr().err == "error: bench: --watch-pacing takes two numbers of milliseconds (to the first " \
        "token, then between tokens), got '100'\n"


def test_growth_exponent() -> None:
    assert growth_exponent([(50, 1.0), (200, 4.0), (1000, 20.0)]) == 1.0
    assert growth_exponent([(50, 1.0), (200, 16.0)]) == 2.0
    assert growth_exponent([(50, 1.0)]) is None


def test_app_bench_json_contract(tmp_path) -> None:
    # One pinned release (the default has two) and two models (the default all of them): the same code, the same
    # figures per release and model.
    models = ["qwen3.6", "llama-3.1"]
    result = subprocess.run([sys.executable, "benchmarks/app_bench.py", "--repeat", "1", "--pinned-releases",
                             "sglang@0.5.12", "--models", ",".join(models), "--json", "-"], cwd=ROOT,
                            capture_output=True, text=True, timeout=900,  # a bound, however loaded
                            env={**os.environ, "DRIFT_WORKSPACE": str(tmp_path / "workspace")})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("first_view_s", "rerun_median_ms", "toggle_median_ms", "toggle_max_ms", "select_cell_median_ms",
                "peak_rss_mb"):
        assert isinstance(data[key], float) and data[key] > 0, key
    assert data["models"] == models
    cells = len(models) * len(scenario_ids())
    assert data["first_view_caption"].startswith(f"{cells} cells in ")
    toggled = [m for m in models if any(isinstance(k.default, bool) for k in load_spec(m).template_kwargs)]
    assert len(toggled) == 2
    assert [k.split(":")[0] for k in data["toggle_ms_by_kwarg"]] == toggled
    assert data["toggle_cached_runs"] == len(toggled)  # one cycle: the flip back
    assert isinstance(data["toggle_cached_median_ms"], float)
    assert "missing ScriptRunContext" not in result.stderr
    # A fresh server's first view of the pinned column, with the result cache and without: all the cells each time.
    assert list(data["pinned"]) == ["sglang@0.5.12 with_cache", "sglang@0.5.12 without_cache"]
    for view in data["pinned"].values():
        assert isinstance(view["seconds"], float) and view["seconds"] > 0
        assert view["caption"].startswith(f"{cells} cells in ")


def test_progress_is_whole_lines_when_stderr_is_not_a_terminal() -> None:
    import io

    from engine.fuzz import stderr_progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log, terminal = io.StringIO(), Terminal()
    for stream in (log, terminal):
        show = stderr_progress(stream)
        for done in (1, 2, 3):
            show(done, 3)
    assert "\r" not in log.getvalue()
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["fuzz: 1/3 conversations",
                                                                          "fuzz: 3/3 conversations"]
    assert terminal.getvalue().startswith("\rfuzz: 1/3 conversations") and terminal.getvalue().endswith("\n")
    assert terminal.getvalue().count("\n") == 1


def test_show_prints_conversation_n_with_the_result_the_run_counted(capsys) -> None:
    from engine.fuzz import run_one

    assert main(["fuzz", "--model", "qwen3.6", "--engine", "vllm", "--seed", "1", "--show", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# random conversation 3 of seed 1 (engine/fuzz.py seed 1 index 3)"
    counted = run_one("qwen3.6", "vllm", 1, 3)
    assert f"result: {counted.status} through vllm@0.33.0" in out
    assert any(line.startswith(f"cause: {counted.cause[0]} {counted.cause[1]} at {counted.cause[2]} ") for line in out)
    assert main(["fuzz", "--model", "qwen3.6", "--engine", "vllm", "--seed", "1", "--show", "3", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["conversation"], data["cell"]["status"], data["cell"]["cause"]["kind"]) == (3, counted.status,
                                                                                           counted.cause[1])
    assert main(["fuzz", "--model", "qwen3.6", "--engine", "vllm", "--n", "10", "--show", "10"]) == 2
    assert capsys.readouterr().err == "error: fuzz: --show takes a conversation number from 0 to 9, got 10\n"
