"""Evidence export (JSON, Markdown, HTML, CSV) and replay, on real templates and tokenizers."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import ExplorerError
from engine.evidence import (
    COMPLETION,
    EVIDENCE_FORMAT,
    break_view,
    cell_evidence,
    cell_markdown,
    evidence_html,
    matrix_csv,
    replay,
)
from engine.models import load_model
from engine.simulate import run_cell

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def qwen_break():
    # Qwen3.6 drops the previous turn's reasoning once a new user turn arrives (preserve_thinking=false).
    return run_cell("qwen3.6", "next-user-turn", "vllm"), load_model("qwen3.6")


def test_break_view_lines_up_the_first_differing_token(qwen_break) -> None:
    cell, model = qwen_break
    focus = cell.focus
    view = break_view(model, focus, context=4)
    assert view.level == "token"
    assert view.first_token == focus.token_prefix.common
    first_prev = next(r for r in view.prev.rows if r.position == view.first_token)
    first_next = next(r for r in view.next.rows if r.position == view.first_token)
    assert (first_prev.text, first_next.text) == ("<think>", "<tool_call>")
    assert first_prev.id == model.tokenizer.token_id("<think>") and first_prev.special
    lines = model.renderer.source_lines()
    # Boundary 2: the first assistant turn (message 2, after the system preamble and the user) is history in both
    # prompts; the previous prompt still shows its reasoning, the next (after a new user message) starts it at the
    # tool call.
    assert (first_prev.message_index, first_next.message_index) == (2, 2)
    assert "<think>" in lines[first_prev.source_line - 1]
    assert first_next.source_line == 114 and "<tool_call>" in lines[113]
    tail = break_view(model, cell.boundaries[0], context=4).prev.rows[-1]
    assert tail.message_index == COMPLETION  # at boundary 1 the last tokens are the model's own output
    assert [r.differs for r in view.prev.rows] == [False] * 4 + [True] * 4
    assert view.prev.text == focus.prev_text[view.prev.char_start:view.prev.char_start + len(view.prev.text)]
    assert view.char_opcodes[0][0] == "equal"


def test_string_level_view_without_tokenizer() -> None:
    cell, model = run_cell("kimi-k2.6", "no-tools-next-user", "raw"), load_model("kimi-k2.6")
    view = break_view(model, cell.focus)
    assert view.level == "string" and view.first_token is None
    # 102 characters into the user turn, which starts after the coding-agent preamble's system turn
    assert cell.focus.prev_prompt.text.index("<|im_user|>") == 3159
    assert view.first_char == cell.focus.string_prefix.common == 3159 + 102
    assert all(r.id is None for r in view.prev.rows)
    assert "".join(r.text for r in view.prev.rows) == view.prev.text


def test_evidence_json_reproduces_and_replays(qwen_break, tmp_path) -> None:
    cell, model = qwen_break
    evidence = cell_evidence(cell, model)
    assert evidence["format"] == EVIDENCE_FORMAT
    assert evidence["reproduce"] == {"model": "qwen3.6", "scenario": "next-user-turn", "engine": "vllm@0.33.0",
                                     "kwargs": {"enable_thinking": True, "preserve_thinking": False}}
    assert evidence["asset_hashes"] == model.asset_hashes
    assert evidence["scenario"]["source"] == "scenarios/next-user-turn.yaml"
    first = evidence["boundaries"][0]
    assert first["completion"]["ids"] == list(cell.boundaries[0].completion_ids)
    assert model.tokenizer.decode(first["completion"]["ids"]) == first["completion"]["text"]
    assert evidence["break"]["first_token"] == cell.focus.token_prefix.common
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(evidence), encoding="utf-8")
    report = replay(path)
    assert report.matches and report.cells == 1


def test_replay_names_what_changed(qwen_break, tmp_path) -> None:
    cell, model = qwen_break
    evidence = cell_evidence(cell, model)
    evidence["result"]["status"] = "holds"
    evidence["asset_hashes"]["tokenizer"] = "0" * 64
    evidence["boundaries"][0]["completion"]["text"] += "x"
    assert evidence["scenario"]["preamble"]["name"] == "coding-agent"
    evidence["scenario"]["preamble"]["sha256"] = "1" * 64
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(evidence), encoding="utf-8")
    report = replay(path)
    assert not report.matches
    assert report.differences == (
        "tampered.json: asset tokenizer sha256 was 000000000000…, is now 5f9e4d4901a9…",
        "tampered.json: the scenario's preamble in scenarios/preambles.yaml changed since the export",
        "tampered.json (qwen3.6 × next-user-turn × vllm@0.33.0): status was holds, is now breaks",
        "tampered.json (qwen3.6 × next-user-turn × vllm@0.33.0): boundary 1 completion text or ids differ",
    )


def test_replay_rejects_a_file_that_is_not_evidence(tmp_path) -> None:
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps({"cells": []}), encoding="utf-8")
    with pytest.raises(ExplorerError, match=r"matrix.json: not a drift-evidence/1 file \(format is None\)"):
        replay(path)


def test_markdown_shows_both_sides_with_visible_whitespace_and_the_cause(qwen_break) -> None:
    cell, model = qwen_break
    text = cell_markdown(cell, model)
    assert text.startswith("### qwen3.6 × next-user-turn × vllm@0.33.0: breaks\n")
    assert ("**Cause** (template, reasoning-dropped: the model's reasoning is missing from the next prompt): "
            "`Qwen-Qwen3.6-35B-A3B.jinja:100-103`") in text
    assert "- emitted at `Qwen-Qwen3.6-35B-A3B.jinja:114`: `{{- '<tool_call>\\n<function=' + tool_call.name + " in text
    assert "**Fix**: set preserve_thinking=true (re-run with preserve_thinking=true: the boundary holds" in text
    assert "<|im_start|>assistant↵\n<think>↵" in text  # previous side, whitespace visible
    assert "| 1009 **≠** | 248068 | `<think>` | 248058 | `<tool_call>` |" in text


def test_html_is_self_contained_and_marks_the_first_token(qwen_break) -> None:
    cell, model = qwen_break
    page = evidence_html([cell], {cell.model: model})
    assert page.startswith("<!doctype html>")
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert page.count("class='first'") == 1
    assert "<code>Qwen-Qwen3.6-35B-A3B.jinja:100-103</code>" in page
    assert "emitted at <code>Qwen-Qwen3.6-35B-A3B.jinja:114</code>" in page


def test_matrix_csv_has_one_row_per_cell() -> None:
    cells = [run_cell("qwen3.6", s, e) for s in ("tool-call", "next-user-turn") for e in ("raw", "bridge")]
    rows = list(csv.DictReader(io.StringIO(matrix_csv(cells))))
    assert [(r["scenario"], r["engine"], r["status"]) for r in rows] == [
        ("tool-call", "raw", "holds"), ("tool-call", "bridge", "holds"),
        ("next-user-turn", "raw", "breaks"), ("next-user-turn", "bridge", "holds")]
    assert rows[2]["cause_location"] == "Qwen-Qwen3.6-35B-A3B.jinja:100-103"


def test_cli_export_then_replay(tmp_path) -> None:
    out = tmp_path / "cell.json"
    md = tmp_path / "cell.md"
    cmd = [sys.executable, "-m", "engine", "export", "--model", "qwen3.5", "--scenario", "args-serialization",
           "--engine", "vllm", "--json", str(out), "--markdown", str(md)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    assert "`vllm/parser/engine/parser_engine.py:437-462`" in md.read_text(encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "engine", "replay", str(out)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{out}: 1 cell(s) recomputed; still matches"


def test_matrix_markdown_has_a_column_per_engine_version() -> None:
    from engine.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["matrix", "--models", "qwen3.6", "--scenarios", "tool-call", "--engines",
                     "sglang,sglang@0.5.12,raw"]) == 0
    assert out.getvalue().splitlines()[:3] == [
        "| scenario | qwen3.6 sglang@0.5.23 | qwen3.6 sglang@0.5.12 | qwen3.6 raw |", "|---|---|---|---|",
        "| tool-call | ✓ | ✓ | ✓ |"]


def test_evidence_of_a_custom_template_cell_carries_the_template_and_replays(tmp_path, monkeypatch) -> None:
    from engine.evidence import upload_json
    from engine.simulate import run_cell_with
    from engine.workspace import Workspace

    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    source = "\n".join(load_model("qwen3.5").renderer.source_lines()).replace(
        "'\\n</think>\\n\\n'", "'\\n</think>\\n'") + "\n"  # one newline fewer after </think>
    workspace = Workspace(tmp_path / "workspace")
    upload = workspace.add("qwen3.5", {"chat_template": ("keep.jinja", source.encode())}, "keep")
    model = workspace.load_model(upload.id)
    cell = run_cell_with(model, "next-user-turn", "vllm", {})
    described = upload_json(workspace.root, upload.id)
    evidence = cell_evidence(cell, model, upload=described)
    assert evidence["reproduce"]["model"] == "qwen3.5+keep"
    assert evidence["upload"]["files"]["chat_template"] == {
        "name": "keep.jinja", "sha256": upload.file("chat_template").sha256, "text": source}
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(evidence, ensure_ascii=False), encoding="utf-8")
    report = replay(path)
    assert (report.cells, report.differences, report.matches) == (1, (), True)
    # Replay rebuilds the model from the evidence alone: with the workspace gone it still matches.
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "elsewhere"))
    assert replay(path).matches
    evidence["upload"]["files"]["chat_template"]["text"] = source.replace("'\\n</think>\\n'", "'\\n</think>\\n\\n'")
    path.write_text(json.dumps(evidence, ensure_ascii=False), encoding="utf-8")
    assert replay(path).differences[0].startswith("evidence.json: asset chat_template sha256 was ")


def test_an_error_cell_is_explained_with_excerpt_link_why_and_fix() -> None:
    from engine.evidence import explain_error

    model = load_model("gpt-oss")
    # vLLM renders gpt-oss through openai-harmony, which renders this turn; the template itself raises. (SGLang 0.5.12's
    # own request side, no longer its emulation, leaves the turn renderable: that column breaks instead.)
    explained = explain_error(run_cell("gpt-oss", "reasoning-truncated", "raw"), model)
    assert explained is not None
    assert (explained.location, explained.line) == ("openai-gpt-oss-120b.jinja:314", 314)
    assert explained.url == "https://huggingface.co/openai/gpt-oss-120b/blob/main/chat_template.jinja#L314"
    assert [n for n, _ in explained.excerpt] == list(range(311, 318))
    assert explained.excerpt[3][1] == ('            {{- "<|start|>assistant<|channel|>final<|message|>" + '
                                       'message.content + "<|end|>" }}')
    assert explained.why == ("the template reads `message.content` unconditionally, and the message the client "
                             "sent back for the model's turn has no 'content' key (an engine returns an empty answer "
                             "as null, and the request drops null keys).")
    assert explained.fix == ("send the key (an empty string rather than null) or guard the line with "
                             "`message.content is defined`; vllm@0.33.0 (holds), sglang@0.5.23 (breaks), "
                             "sglang@0.5.12 (breaks), bridge (holds) render this scenario for gpt-oss")
    assert explain_error(run_cell("gpt-oss", "tool-call", "vllm"), model) is None


def _diff(view) -> list[tuple[str, str, str]]:
    return [(op, view.prev.text[a1:a2], view.next.text[b1:b2]) for op, a1, a2, b1, b2 in view.char_opcodes]


def test_character_diff_starts_at_the_differing_token_and_pairs_only_whole_tokens(qwen_break) -> None:
    cell, model = qwen_break
    view = break_view(model, cell.focus, 8)
    assert view.prev.text.startswith(" Paris today?") and view.next.text.startswith(" Paris today?")
    # Not "<t" kept and "hink>…" vs "ool_call>…"; not "call" of "should call" paired with "call" of "tool_call".
    assert _diff(view) == [
        ("equal", " Paris today?<|im_end|>\n<|im_start|>assistant\n",
         " Paris today?<|im_end|>\n<|im_start|>assistant\n"),
        ("replace", "<think>\nI should call get", "<tool_call>\n<function=get"),
        ("equal", "_weather", "_weather"),
        ("replace", " for", ">\n"),
    ]


def test_string_level_windows_start_at_a_marker() -> None:
    cell, model = run_cell("kimi-k2.6", "no-tools-next-user", "raw"), load_model("kimi-k2.6")
    view = break_view(model, cell.focus, 8)
    assert view.level == "string"
    assert (view.prev.text[:10], view.next.text[:10]) == ("<|im_end|>", "<|im_end|>")
    assert _diff(view) == [
        ("equal", "<|im_end|><|im_assistant|>assistant<|im_middle|><think>",
         "<|im_end|><|im_assistant|>assistant<|im_middle|><think>"),
        ("delete", "17 times 3 is 51.", ""), ("equal", "</think>51<|im_end|>", "</think>51<|im_end|>"),
        ("insert", "", "<|im_user|>user<|im_middle|>")]


def test_render_show_source_prints_whole_template_lines(tmp_path) -> None:
    from engine.cli import main

    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "ok", "reasoning_content": "think first"}]),
                        encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["render", "--model", "qwen3.5", "--messages", str(messages), "--show-source",
                     "--no-generation-prompt"]) == 0
    lines = load_model("qwen3.5").renderer.source_lines()
    shown = [line.split("└ ", 1)[1] for line in out.getvalue().splitlines() if "└ " in line]
    assert max(len(s) for s in shown) > 100
    assert all(s in {source.strip() for source in lines} for s in shown)
