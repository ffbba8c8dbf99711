"""Regenerate tests/golden/ by running the REAL vLLM / SGLang parsers on the corpus.

    python tests/conformance/generate.py [--work /tmp/drift-oracle] [--only vllm@0.33.0]

Creates a throw-away venv under --work, downloads the engine wheels with `pip download --no-deps`, unpacks only their
Python sources into one sys.path root per engine version (never into the project), installs the few light
dependencies the parsers need, and runs tests/conformance/oracle_runner.py once per engine version.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PROJECT))

import corpus  # noqa: E402
import known_gaps  # noqa: E402

ENGINES = {
    "vllm@0.33.0": ("vllm", "vllm==0.33.0"),
    "sglang@0.5.23": ("sglang", "sglang==0.5.23"),
    "sglang@0.5.12": ("sglang", "sglang==0.5.12"),
}
LIGHT_DEPS = ["pydantic", "partial-json-parser", "regex", "orjson", "packaging", "openai-harmony==0.0.8"]
GOLDEN = PROJECT / "tests" / "golden"


def ensure_venv(work: Path) -> Path:
    python = work / "venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *LIGHT_DEPS], check=True)
    return python


def ensure_root(work: Path, spec: str, requirement: str) -> Path:
    root = work / "roots" / spec
    marker = root / ".complete"
    if marker.exists():
        return root
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(wheels)], check=True
    )
    name, version = requirement.split("==")
    wheel = next(wheels.glob(f"{name}-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root, [n for n in archive.namelist() if n.endswith(".py")])
    marker.touch()
    return root


@functools.cache
def _harmony():
    from engine.parsers.harmony_encoding import o200k_base_path

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
                token_ids = harmony_tokens(text) if family.harmony else None
                chunks = harmony_chunks(token_ids) if family.harmony else corpus.chunk(text, family)
                for mode in ("ns", "st"):
                    jobs.append(
                        {
                            "id": f"{family.name}/{reasoning_parser}+{tool_parser}/{case_name}/{mode}",
                            "family": family.name,
                            "case": case_name,
                            "mode": mode,
                            "text": text,
                            "tools": tools,
                            "reasoning_parser": reasoning_parser,
                            "tool_parser": tool_parser,
                            "chunks": chunks,
                            "token_ids": token_ids,
                            "special_tokens": family.special_tokens,
                            "not_special": sorted(family.not_special),
                            "prompt_tail": family.prompt_tail,
                            "model_type": family.model_type,
                            "harmony": family.harmony,
                            "chat_template_kwargs": None,
                            "history_tool_calls": 0,
                        }
                    )
    return jobs


def write_golden(spec: str, jobs: list[dict], results: list[dict], seconds: float) -> int:
    by_id = {r["id"]: r for r in results}
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
            "oracle_seconds": round(seconds, 1),
            "cases": cases,
        }
        (out_dir / f"{family}.json").write_text(
            json.dumps(payload, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
    return len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/drift-oracle", type=Path)
    parser.add_argument("--only", action="append", help="engine@version to regenerate (default: all)")
    args = parser.parse_args()
    started = time.monotonic()
    python = ensure_venv(args.work)
    for spec in args.only or list(ENGINES):
        engine, requirement = ENGINES[spec]
        root = ensure_root(args.work, spec, requirement)
        jobs = build_jobs(engine)
        t0 = time.monotonic()
        env = {
            "TIKTOKEN_ENCODINGS_BASE": str(
                __import__("engine.parsers.harmony_encoding", fromlist=["x"]).o200k_base_path().parent
            ),
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        }
        proc = subprocess.run(
            [str(python), str(HERE / "oracle_runner.py"), engine, str(root)],
            input=json.dumps(jobs),
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            sys.exit(f"oracle failed for {spec}:\n{proc.stderr[-4000:]}")
        seconds = time.monotonic() - t0
        count = write_golden(spec, jobs, json.loads(proc.stdout), seconds)
        print(f"{spec}: {count} cases, oracle {seconds:.1f}s")
    print(f"total {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
