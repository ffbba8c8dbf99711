"""Regenerate tests/golden/ by running each pinned release's own serving code on the corpus.

    python tests/conformance/generate.py [--only sglang@0.5.23]

Every case goes through the real-engine backend (engine/serving/real: the release's Python sources fetched from
PyPI into the engine cache, run in a sandboxed worker): vLLM's chat_completion_full_generator and streaming generator,
SGLang's _build_chat_response and _generate_chat_stream, with the parsers, serving-layer rules and (SGLang 0.5.23,
DeepSeek V4) the deepseek-recipe path that release's server runs. The expected values are what a client of that
server receives, not what the parser classes return on their own (the earlier oracle's hand-written glue differed
from the serving code in 32 cases: SGLang 0.5.23 parses DeepSeek V4 through deepseek-recipe, and SGLang 0.5.12's
_check_for_unstreamed_tool_args re-dumps DSML arguments that are already a string).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PROJECT))

import corpus  # noqa: E402
import golden_serving  # noqa: E402
import known_gaps  # noqa: E402

PINNED = ("vllm@0.33.0", "sglang@0.5.23", "sglang@0.5.12")
GOLDEN = PROJECT / "tests" / "golden"


@functools.cache
def _harmony():
    from engine.render.harmony_encoding import o200k_base_path

    o200k_base_path()
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def harmony_tokens(text: str) -> list[int]:
    return list(_harmony().encode(text, allowed_special="all"))


def harmony_chunks(ids: list[int]) -> list[str]:
    # one chunk per token, as the detokenizer streams them (a token may end inside a UTF-8 sequence)
    return [_harmony().decode([i]) for i in ids] or [""]


def build_jobs(engine: str) -> list[dict]:
    jobs = []
    for family in corpus.FAMILIES.values():
        for reasoning_parser, tool_parser in family.engine_parsers[engine]:
            variants = [(name, text, corpus.TOOLS) for name, text in corpus.texts_for(family)]
            variants += [(f"{name}~no_tools", text, None) for name, text in corpus.texts_for(family)
                         if name in corpus.NO_TOOLS_CASES]
            for case_name, text, tools in variants:
                chunks = harmony_chunks(harmony_tokens(text)) if family.harmony else corpus.chunk(text, family)
                for mode in ("ns", "st"):
                    jobs.append({
                        "id": f"{family.name}/{reasoning_parser}+{tool_parser}/{case_name}/{mode}",
                        "family": family.name, "mode": mode, "text": text, "tools": tools,
                        "reasoning_parser": reasoning_parser, "tool_parser": tool_parser, "chunks": chunks,
                        "chat_template_kwargs": golden_serving.request_kwargs(engine, family.name),
                        "history_tool_calls": 0,
                    })
    return jobs


def run_jobs(spec: str, jobs: list[dict]) -> dict[str, dict]:
    """Each job through the release's own serving code: {"output": the recorded fields | None, "error": str | None}."""
    from engine.serving.real.backend import RealEngine

    engine = RealEngine(*spec.split("@"))
    results = {}
    for job in jobs:
        result = golden_serving.run_case(engine, job)
        if result.warnings:
            sys.exit(f"{spec} {job['id']}: the parse touched stubbed code ({', '.join(result.warnings)}); its result "
                     "is not the server's")
        results[job["id"]] = {"output": golden_serving.normalised(result), "error": result.error}
    return results


def write_golden(spec: str, jobs: list[dict], by_id: dict[str, dict], seconds: float) -> int:
    out_dir = GOLDEN / spec
    out_dir.mkdir(parents=True, exist_ok=True)
    families: dict[str, list[dict]] = {}
    for job in jobs:
        result = by_id[job["id"]]
        families.setdefault(job["family"], []).append(
            {
                "id": job["id"],
                # the file's tools unless the case's request declares none
                **({} if job["tools"] is corpus.TOOLS else {"tools": job["tools"]}),
                "text": job["text"],
                "reasoning_parser": job["reasoning_parser"],
                "tool_parser": job["tool_parser"],
                "mode": job["mode"],
                "chunks": job["chunks"],
                "chat_template_kwargs": job["chat_template_kwargs"],
                "history_tool_calls": job["history_tool_calls"],
                "expected": result["output"],
                "error": result["error"],
                "known_gap": known_gaps.reason(spec, job["id"]),
            }
        )
    for family, cases in families.items():
        payload = {
            "engine": spec,
            "family": family,
            "tools": corpus.TOOLS,
            "seconds": round(seconds, 1),
            "cases": cases,
        }
        (out_dir / f"{family}.json").write_text(
            json.dumps(payload, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
    return len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=PINNED, help="engine@version to regenerate (default: all)")
    args = parser.parse_args()
    started = time.monotonic()
    for spec in args.only or PINNED:
        jobs = build_jobs(spec.split("@")[0])
        t0 = time.monotonic()
        results = run_jobs(spec, jobs)
        seconds = time.monotonic() - t0
        count = write_golden(spec, jobs, results, seconds)
        print(f"{spec}: {count} cases through its serving code, {seconds:.1f}s")
    print(f"total {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
