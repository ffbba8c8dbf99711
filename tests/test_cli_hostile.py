"""Hostile input to the CLI: every malformed file, id or option ends in one sentence on stderr and its documented
exit code (README: 0 holds, 1 breaks / no longer matches, 2 bad input), never a traceback, well under 15 s.

The trace reader (`python -m engine trace`) is fed every malformed sample of samples/traces/malformed/, /dev/zero
and a missing file.
Each case runs `engine.cli.main` in this process (a process start per case would cost seconds); one case per
command also runs as a real subprocess to prove what a shell sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import main
from engine.evidence import EVIDENCE_FORMAT

ROOT = Path(__file__).resolve().parent.parent
# A hang guard, not a speed test: a refusal that hangs never ends, and beside other CPU-bound work a check that takes
# seconds idle (a sandbox worker start, 14 scenarios) can take tens.
HANG_GUARD_S = 60.0
DEEP = "[" * 100_000 + "]" * 100_000


def _write(tmp_path: Path, name: str, data: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def run_cli(argv: list[str], capsys) -> tuple[int, str, float]:
    started = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    return code, err, elapsed


def assert_one_sentence(code: int, err: str, elapsed: float, expected: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    assert expected in lines[0], lines[0]
    assert elapsed < HANG_GUARD_S


@pytest.fixture(scope="module")
def evidence() -> dict:
    from engine.evidence import cell_evidence
    from engine.models import load_model
    from engine.simulate import run_cell

    return cell_evidence(run_cell("qwen3.5", "tool-call", "raw", {}), load_model("qwen3.5"))


# ---- check ------------------------------------------------------------------------------------------------------

CHECK_CASES = [
    ("unknown-engine", ["--engine", "nonsense"], None,
     "unknown engine 'nonsense'; known: raw, bridge, renderers, sglang, vllm"),
    ("unknown-version", ["--engine", "vllm@9"], None, "unknown engine 'vllm@9'"),
    ("unknown-model", ["--model", "nosuch"], None, "unknown model 'nosuch'; known models: "),
    ("path-as-model", ["--model", "../../etc"], None, "unknown model '../../etc'"),
    ("dev-zero", [], "/dev/zero", "/dev/zero is larger than the 5.0 MB limit for a chat template "
     "(DRIFT_UPLOAD_MAX_TEXT_BYTES)"),
    ("missing", [], "/nonexistent/x.jinja", "/nonexistent/x.jinja cannot be read as a chat template (No such file"),
    ("folder", [], "/tmp", "/tmp is a folder, not a chat template"),
    ("nul", [], b"{{ 'a' }}\x00", "contains a NUL byte at byte offset 9: it is a binary file, not text"),
    ("empty", [], b"", "is empty"),
    ("blank", [], b"  \n", "is empty (only whitespace)"),
    ("bom", [], "\ufeff{{ messages[0].content }}".encode(), "starts with a byte-order mark (U+FEFF)"),
    ("latin-1", [], b"caf\xe9", "is not UTF-8 text: byte 0xe9 at byte offset 3"),
]


@pytest.mark.parametrize("extra,template,expected", [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_check_refuses_bad_input_in_one_sentence(tmp_path, capsys, extra, template, expected):
    if template is None or isinstance(template, bytes):
        template = _write(tmp_path, "t.jinja", template if template is not None else b"{{ 'x' }}")
    argv = ["check", "--model", "qwen3.5", "--template", template, *extra]
    assert_one_sentence(*run_cli(argv, capsys), expected)


def test_check_on_a_template_that_loops_on_later_turns_pays_the_limit_once(tmp_path, capsys, monkeypatch):
    from engine.assets import resolve_asset
    from engine.models import load_spec

    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "1.5")
    spec = load_spec("qwen3.5")
    stock = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data.decode("utf-8")
    sneaky = ("{%- if messages | selectattr('role', 'equalto', 'tool') | list %}{% for i in range(100000) %}"
              "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + stock)
    started = time.monotonic()
    code = main(["check", "--model", "qwen3.5", "--template", _write(tmp_path, "sneaky.jinja", sneaky)])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert code == 1
    # The basic conversation renders; the first scenario with a tool turn hits the limit, and every other render of
    # the template in this run says so at once instead of waiting for the limit again.
    assert lines[1] == "error       args-serialization"
    assert lines[2].strip() == "sneaky.jinja for model qwen3.5 (custom) was stopped after 1.5 s (render time limit)"
    assert " ".join(out.split()).count("(render time limit) earlier in this view, so it was not rendered again") == 13
    assert lines[-1] == "14 scenarios: 0 break PRR, 14 errors (the template failed to render: no PRR result), 0 hold"
    assert elapsed < HANG_GUARD_S


# ---- render -----------------------------------------------------------------------------------------------------

RENDER_CASES = [
    ("empty-object", "{}", "expected a non-empty list of messages, or an object with one under \"messages\""),
    ("numbers", "[1, 2]", "message 0 must be an object with a string \"role\""),
    ("messages-a-string", '{"messages": "hi"}', "expected a non-empty list of messages"),
    ("null", "null", "expected a non-empty list of messages"),
    ("deep", DEEP, "is not usable JSON: it is nested too deeply"),
    ("not-json", "{'role': 'user'}", "is not valid JSON: Expecting property name enclosed in double quotes (line 1, "
     "column 2)"),
    ("content-object", '[{"role": "user", "content": {"a": 1}}]', "message 0's content must be a string, a list of "
     "parts or null"),
    ("tools-not-list", '{"messages": [{"role": "user", "content": "hi"}], "tools": "x"}',
     "\"tools\" must be a list of objects"),
]


@pytest.mark.parametrize("payload,expected", [c[1:] for c in RENDER_CASES], ids=[c[0] for c in RENDER_CASES])
def test_render_refuses_bad_messages_in_one_sentence(tmp_path, capsys, payload, expected):
    argv = ["render", "--model", "qwen3.5", "--messages", _write(tmp_path, "m.json", payload)]
    assert_one_sentence(*run_cli(argv, capsys), expected)


def test_render_refuses_dev_zero_and_an_unknown_renderer(capsys, tmp_path):
    assert_one_sentence(*run_cli(["render", "--model", "qwen3.5", "--messages", "/dev/zero"], capsys),
                        "/dev/zero is larger than the 5.0 MB limit for a messages JSON file")
    good = _write(tmp_path, "m.json", '[{"role": "user", "content": "hi"}]')
    assert_one_sentence(*run_cli(["render", "--model", "qwen3.5", "--messages", good, "--renderer", "x"], capsys),
                        "model qwen3.5: unknown renderer 'x'")


# ---- session ----------------------------------------------------------------------------------------------------

def _steps(n: int) -> str:
    return json.dumps({"steps": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"}
                                 for i in range(n)]})


SESSION_CASES = [
    ("nested", json.dumps({"steps": []})[:-1] + ', "x": ' + DEEP + "}", "is not usable JSON: it is nested too deeply"),
    ("too-many-steps", _steps(201), "has 201 steps, over the limit of 200 (DRIFT_SESSION_MAX_STEPS)"),
    ("not-an-object", "[1, 2]", "is malformed: it must be a JSON object"),
    ("steps-missing", "{}", "is malformed: 'steps'"),
    ("step-content-object", '{"steps": [{"role": "user", "content": {"a": 1}}]}',
     "step 0's content must be a string, not dict"),
    ("step-not-a-message", '{"steps": [3]}', "step 0 must be a message whose role is one of"),
    ("no-request", '{"steps": [{"role": "assistant", "content": "x"}]}', "has no user or tool message"),
]


@pytest.mark.parametrize("script,expected", [c[1:] for c in SESSION_CASES], ids=[c[0] for c in SESSION_CASES])
def test_session_refuses_bad_scripts_in_one_sentence(tmp_path, capsys, script, expected):
    argv = ["session", "--model", "qwen3.5", "--script", _write(tmp_path, "s.json", script)]
    assert_one_sentence(*run_cli(argv, capsys), expected)


def test_session_refuses_dev_zero_an_unknown_script_and_engine(capsys):
    assert_one_sentence(*run_cli(["session", "--model", "qwen3.5", "--script", "/dev/zero"], capsys),
                        "/dev/zero is larger than the 5.0 MB limit for a session script")
    assert_one_sentence(*run_cli(["session", "--model", "qwen3.5", "--script", "nosuch"], capsys),
                        "no session script 'nosuch': not a file, and not one of handbook")
    assert_one_sentence(*run_cli(["session", "--model", "qwen3.5", "--script", "handbook", "--engine", "x"],
                                 capsys), "unknown engine 'x'")


# ---- replay -----------------------------------------------------------------------------------------------------

def _mutated(evidence: dict, change) -> dict:
    data = json.loads(json.dumps(evidence))
    change(data)
    return data


REPLAY_CASES = [
    ("model-path", lambda e: e["reproduce"].update(model="../../etc"), "unknown model '../../etc'"),
    ("model-list", lambda e: e["reproduce"].update(model=["x"]), "reproduce names unknown model of type list"),
    ("scenario-path", lambda e: e["reproduce"].update(scenario="../../x"),
     "reproduce names unknown scenario '../../x'; known: args-serialization"),
    ("scenario-number", lambda e: e["reproduce"].update(scenario=3), "reproduce names unknown scenario of type int"),
    ("engine-unknown", lambda e: e["reproduce"].update(engine="nonsense"), "reproduce names unknown engine 'nonsense'"),
    ("engine-number", lambda e: e["reproduce"].update(engine=7), "reproduce names unknown engine of type int"),
    ("kwargs-list", lambda e: e["reproduce"].update(kwargs=[1]), "reproduce.kwargs must be an object, not list"),
    ("kwarg-type", lambda e: e["reproduce"]["kwargs"].update(enable_thinking="yes"),
     "reproduce.kwargs enable_thinking must be bool for qwen3.5, got \"yes\""),
    ("kwarg-name", lambda e: e["reproduce"]["kwargs"].update({"a b": 1}),
     "reproduce.kwargs holds 'a b', which is not a template kwarg name"),
    ("no-reproduce", lambda e: e.pop("reproduce"), "not drift evidence: missing 'reproduce'"),
    ("no-result", lambda e: e.pop("result"), "not drift evidence: \"result\" must be an object"),
    ("asset-hashes-list", lambda e: e.update(asset_hashes=[1]), "not drift evidence: a AttributeError"),
    ("boundaries-numbers", lambda e: e.update(boundaries=[1, 2]), "not drift evidence: a TypeError"),
    ("scenario-string", lambda e: e.update(scenario="x"), "not drift evidence: a AttributeError"),
]


@pytest.mark.parametrize("change,expected", [c[1:] for c in REPLAY_CASES], ids=[c[0] for c in REPLAY_CASES])
def test_replay_refuses_malformed_evidence_in_one_sentence(tmp_path, capsys, evidence, change, expected):
    path = _write(tmp_path, "e.json", json.dumps(_mutated(evidence, change)))
    assert_one_sentence(*run_cli(["replay", path], capsys), expected)


REPLAY_FILES = [
    ("not-json", "{", "is not valid JSON: Expecting property name enclosed in double quotes"),
    ("a-list", "[]", "not a drift-evidence"),
    ("wrong-format", '{"format": "x"}', "not a drift-evidence"),
    ("cells-not-list", json.dumps({"format": EVIDENCE_FORMAT, "cells": {"a": 1}}),
     "\"cells\" must be a non-empty list of cell evidence objects"),
    ("cells-numbers", json.dumps({"format": EVIDENCE_FORMAT, "cells": [1]}),
     "\"cells\" must be a non-empty list of cell evidence objects"),
    ("deep", DEEP, "is not usable JSON: it is nested too deeply"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00", "is not UTF-8 text"),
]


@pytest.mark.parametrize("data,expected", [c[1:] for c in REPLAY_FILES], ids=[c[0] for c in REPLAY_FILES])
def test_replay_refuses_a_file_that_is_not_evidence(tmp_path, capsys, data, expected):
    assert_one_sentence(*run_cli(["replay", _write(tmp_path, "e.json", data)], capsys), expected)


def test_replay_of_dev_zero_and_good_evidence(tmp_path, capsys, evidence):
    assert_one_sentence(*run_cli(["replay", "/dev/zero"], capsys),
                        "/dev/zero is larger than the 50.0 MB limit for an evidence JSON file")
    assert main(["replay", _write(tmp_path, "e.json", json.dumps(evidence))]) == 0
    changed = _mutated(evidence, lambda e: e["result"].update(status="breaks"))
    assert main(["replay", _write(tmp_path, "e.json", json.dumps(changed))]) == 1


# ---- matrix --scenarios -----------------------------------------------------------------------------------------

MATRIX_CASES = [
    ("scenario-path", ["--scenarios", "../../x"], "unknown scenario '../../x'; known: args-serialization"),
    ("scenario-yaml-elsewhere", ["--scenarios", "tools"], "unknown scenario 'tools'"),
    ("model-unknown", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("engine-unknown", ["--engines", "vllm@9"], "unknown engine 'vllm@9'"),
    ("kwargs-malformed", ["--kwargs", "qwen3.5"], "--kwargs takes model:key=value, got 'qwen3.5'"),
]


@pytest.mark.parametrize("argv,expected", [c[1:] for c in MATRIX_CASES], ids=[c[0] for c in MATRIX_CASES])
def test_matrix_refuses_unknown_ids_in_one_sentence(capsys, argv, expected):
    assert_one_sentence(*run_cli(["matrix", *argv], capsys), expected)


# ---- as a shell sees it -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,expected", [
    (["check", "--model", "qwen3.5", "--template", "/dev/zero"], "error: /dev/zero is larger than the 5.0 MB limit"),
    (["check", "--model", "qwen3.5", "--template", "/dev/zero", "--engine", "nonsense"], "error: unknown engine"),
    (["replay", "/dev/zero"], "error: /dev/zero is larger than the 50.0 MB limit for an evidence JSON file"),
    (["matrix", "--scenarios", "../../x"], "error: unknown scenario '../../x'"),
], ids=["check", "check-engine", "replay", "matrix"])
def test_a_subprocess_gets_one_line_and_exit_2(argv, expected):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "engine", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S * 4)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(expected) and done.stderr.count("\n") == 1, done.stderr
    assert time.monotonic() - started < HANG_GUARD_S * 4  # a cold process start imports transformers


# ---- trace ------------------------------------------------------------------------------------------------------

MALFORMED_TRACES = sorted((ROOT / "samples" / "traces" / "malformed").iterdir())


@pytest.mark.parametrize("path", MALFORMED_TRACES, ids=[p.name for p in MALFORMED_TRACES])
def test_trace_refuses_a_malformed_trace_in_one_sentence(capsys, path):
    code, err, elapsed = run_cli(["trace", str(path)], capsys)
    # The sentence names the file, then the line or record and what is wrong there.
    assert_one_sentence(code, err, elapsed, f"error: {path.name}: ")


@pytest.mark.parametrize("path,expected", [
    ("/dev/zero", "zero: line 1 is not any trace format read here"),
    ("/nonexistent/trace.log", "trace.log cannot be read: No such file or directory"),
])
def test_trace_refuses_dev_zero_and_a_missing_file(capsys, path, expected):
    code, err, elapsed = run_cli(["trace", path], capsys)
    assert_one_sentence(code, err, elapsed, expected)
