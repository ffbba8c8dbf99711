"""The seed article's DriftMatrix rows for its five models, as the code at these versions gives them.

For each model: whitespace in reasoning and after `</think>`, reasoning truncation, tool-call fault tolerance and
argument serialization, through the template alone (`raw`) and through vLLM 0.33.0, SGLang 0.5.23 and 0.5.12.
Each row is (model, scenario, engine, status, "stage kind location" of the cause, or the error's sentence head).
Where the code disagrees with the article, the row follows the code; docs/FINDINGS.md says where and why.
History-thinking retention and its kwargs are pinned in tests/test_simulate.py.
"""

from __future__ import annotations

import pytest

from engine.simulate import run_cell

ROWS = [
    ('qwen3.6', 'reasoning-whitespace', 'raw', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'raw', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'reasoning-truncated', 'raw', 'breaks', 'template output-rewritten Qwen-Qwen3.6-35B-A3B.jinja:103'),
    ('qwen3.6', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:130'),
    ('qwen3.6', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:130'),
    ('qwen3.6', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:130'),
    ('qwen3.6', 'tool-call-truncated', 'raw', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:114'),
    ('qwen3.6', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:114'),
    ('qwen3.6', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:114'),
    ('qwen3.6', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:114'),
    ('qwen3.6', 'args-serialization', 'raw', 'holds', None),
    ('qwen3.6', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser param_trim_newline vllm/parser/qwen3.py:61-67'),
    ('qwen3.6', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser param_trim_newline sglang/srt/function_call/qwen3_coder_detector.py:215-219'),
    ('qwen3.6', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser param_trim_newline sglang/srt/function_call/qwen3_coder_detector.py:209-213'),
    ('glm-5.1', 'reasoning-whitespace', 'raw', 'holds', None),
    ('glm-5.1', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning_rstrip vllm/parser/engine/parser_engine.py:585-588'),
    ('glm-5.1', 'reasoning-whitespace', 'sglang@0.5.23', 'holds', None),
    ('glm-5.1', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning_strip sglang/srt/parser/reasoning_parser.py:73-75'),
    ('glm-5.1', 'newline-after-think', 'raw', 'breaks', 'template whitespace-rewritten zai-org-GLM-5.1.jinja:76'),
    ('glm-5.1', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten zai-org-GLM-5.1.jinja:76'),
    ('glm-5.1', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten zai-org-GLM-5.1.jinja:76'),
    ('glm-5.1', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten zai-org-GLM-5.1.jinja:76'),
    ('glm-5.1', 'reasoning-truncated', 'raw', 'breaks', 'template output-rewritten zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'tool-call-truncated', 'raw', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:78'),
    ('glm-5.1', 'args-serialization', 'raw', 'holds', None),
    ('glm-5.1', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args_raw_values_dumped vllm/parser/glm47_moe.py:67-90'),
    ('glm-5.1', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args_parse_dump sglang/srt/function_call/glm47_moe_detector.py:249-298'),
    ('glm-5.1', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args_parse_dump sglang/srt/function_call/glm47_moe_detector.py:94-142'),
    ('kimi-k2.6', 'reasoning-whitespace', 'raw', 'holds', None),
    ('kimi-k2.6', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning_rstrip vllm/parser/engine/parser_engine.py:586-587'),
    ('kimi-k2.6', 'reasoning-whitespace', 'sglang@0.5.23', 'holds', None),
    ('kimi-k2.6', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning_strip sglang/srt/parser/reasoning_parser.py:73-75'),
    ('kimi-k2.6', 'newline-after-think', 'raw', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'parser drop_ws_content vllm/parser/engine/parser_engine.py:904-906'),
    ('kimi-k2.6', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'parser content_before_section sglang/srt/function_call/kimik2_detector.py:205-206'),
    ('kimi-k2.6', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'parser content_strip sglang/srt/parser/reasoning_parser.py:102'),
    ('kimi-k2.6', 'reasoning-truncated', 'raw', 'breaks', 'template closes-truncated-output moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template closes-truncated-output moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template closes-truncated-output moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template closes-truncated-output moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'tool-call-truncated', 'raw', 'holds', None),
    ('kimi-k2.6', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser args_invalid_to_empty vllm/renderers/chat_utils/chat_message.py:699-771'),
    ('kimi-k2.6', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'parser content_before_section sglang/srt/function_call/kimik2_detector.py:205-206'),
    ('kimi-k2.6', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template closes-truncated-output moonshotai-Kimi-K2.6.jinja:68'),
    ('kimi-k2.6', 'args-serialization', 'raw', 'holds', None),
    ('kimi-k2.6', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args_schema_coerce vllm/parser/engine/parser_engine.py:437-462'),
    ('kimi-k2.6', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args_orjson_loads sglang/srt/entrypoints/openai/serving_chat.py:181-194'),
    ('kimi-k2.6', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args_orjson_loads sglang/srt/entrypoints/openai/serving_chat.py:181-194'),
    ('deepseek-v4', 'reasoning-whitespace', 'raw', 'holds', None),
    ('deepseek-v4', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning_rstrip vllm/parser/engine/parser_engine.py:586-587'),
    ('deepseek-v4', 'reasoning-whitespace', 'sglang@0.5.23', 'holds', None),
    ('deepseek-v4', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning_strip sglang/srt/parser/reasoning_parser.py:73-75'),
    ('deepseek-v4', 'newline-after-think', 'raw', 'holds', None),
    ('deepseek-v4', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'parser tool_pass_content vllm/parser/abstract_parser.py:452-491'),
    ('deepseek-v4', 'newline-after-think', 'sglang@0.5.23', 'holds', None),
    ('deepseek-v4', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'parser content_strip sglang/srt/parser/reasoning_parser.py:102'),
    ('deepseek-v4', 'reasoning-truncated', 'raw', 'breaks', 'template closes-truncated-output encoding_dsv4.py:388'),
    ('deepseek-v4', 'reasoning-truncated', 'vllm@0.33.0', 'holds', None),
    ('deepseek-v4', 'reasoning-truncated', 'sglang@0.5.23', 'holds', None),
    ('deepseek-v4', 'reasoning-truncated', 'sglang@0.5.12', 'holds', None),
    ('deepseek-v4', 'tool-call-truncated', 'raw', 'holds', None),
    ('deepseek-v4', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser args_dsml_to_json vllm/parser/deepseek_v4.py:79-112'),
    ('deepseek-v4', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'parser content_before_tool_block sglang/srt/function_call/deepseekv32_detector.py:203-217'),
    ('deepseek-v4', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'parser content_strip sglang/srt/parser/reasoning_parser.py:102'),
    ('deepseek-v4', 'args-serialization', 'raw', 'breaks', 'template whitespace-rewritten encoding_dsv4.py:357'),
    ('deepseek-v4', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template output-rewritten encoding_dsv4.py:357'),
    ('deepseek-v4', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten encoding_dsv4.py:357'),
    ('deepseek-v4', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten encoding_dsv4.py:357'),
    ('gpt-oss', 'reasoning-whitespace', 'raw', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'raw', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-truncated', 'raw', 'error', 'openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314'),
    ('gpt-oss', 'reasoning-truncated', 'vllm@0.33.0', 'error', 'openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314'),
    ('gpt-oss', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template closes-truncated-output openai-gpt-oss-120b.jinja:314'),
    ('gpt-oss', 'reasoning-truncated', 'sglang@0.5.12', 'error', 'openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314'),
    ('gpt-oss', 'tool-call-truncated', 'raw', 'breaks', 'template closes-truncated-output openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template closes-truncated-output openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template closes-truncated-output openai-gpt-oss-120b.jinja:314'),
    ('gpt-oss', 'tool-call-truncated', 'sglang@0.5.12', 'error', 'openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314'),
    ('gpt-oss', 'args-serialization', 'raw', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template whitespace-rewritten openai-gpt-oss-120b.jinja:296'),
]


@pytest.mark.parametrize(("model", "scenario", "engine", "status", "cause"), ROWS,
                         ids=[f"{r[0]}/{r[1]}/{r[2]}" for r in ROWS])
def test_drift_matrix_row(model: str, scenario: str, engine: str, status: str, cause: str | None) -> None:
    cell = run_cell(model, scenario, engine)
    assert cell.status == status
    if cell.status == "error":
        assert cell.note is not None and cell.note.startswith(cause)
    else:
        c = cell.cause
        assert (f"{c.stage} {c.kind} {c.location}" if c else None) == cause


def test_article_vs_code_reasoning_whitespace() -> None:
    """The article: vLLM's reasoning parsers are zero-drift, SGLang strips. At these versions it is the reverse for
    GLM, Kimi and DeepSeek: vLLM's declarative parser engine rstrips reasoning (Qwen3 turns it off), SGLang 0.5.23
    no longer strips (0.5.12 did)."""
    for model in ("glm-5.1", "kimi-k2.6", "deepseek-v4"):
        assert run_cell(model, "reasoning-whitespace", "vllm@0.33.0").cause.kind == "reasoning_rstrip"
        assert run_cell(model, "reasoning-whitespace", "sglang@0.5.23").status == "holds"
        assert run_cell(model, "reasoning-whitespace", "sglang@0.5.12").cause.kind == "reasoning_strip"
    assert run_cell("qwen3.6", "reasoning-whitespace", "vllm@0.33.0").cause.stage == "template"


def test_article_vs_code_kimi_arguments() -> None:
    """The article: Kimi's parsers keep the model's JSON string. vLLM 0.33.0 re-dumps it when coercing a value to the
    tool schema changes anything; SGLang's request side parses it into a dict that the template re-serialises."""
    assert run_cell("kimi-k2.6", "args-serialization", "raw").status == "holds"
    assert run_cell("kimi-k2.6", "args-serialization", "vllm@0.33.0").cause.kind == "args_schema_coerce"
    assert run_cell("kimi-k2.6", "args-serialization", "sglang@0.5.23").cause.kind == "args_orjson_loads"


def test_a_client_that_drops_reasoning_is_the_cause_where_the_template_would_keep_it() -> None:
    # The scenario's client sends the assistant turn back without reasoning_content. Re-run with a client that echoes
    # everything: where that holds, the client is the cause (its setting's line in the scenario file).
    for model in ("qwen3.6", "glm-5.1", "kimi-k2.6", "deepseek-v4"):
        cause = run_cell(model, "client-drops-reasoning", "vllm").cause
        assert (cause.stage, cause.kind, cause.location) == (
            "client", "client-send-reasoning", "scenarios/client-drops-reasoning.yaml:6")
        assert cause.line_text == "send_reasoning: false   # the OpenAI-style client keeps content and tool_calls only"
        assert cause.fix == {"kind": "client", "setting": "send_reasoning", "value": True,
                             "text": "send the assistant turn back whole (send_reasoning=true)"}
    # GPT-OSS's template re-renders the history call in another form whatever the client sends: template first.
    assert run_cell("gpt-oss", "client-drops-reasoning", "vllm").cause.stage == "template"
    assert run_cell("qwen3.6", "client-drops-reasoning", "bridge").status == "holds"
