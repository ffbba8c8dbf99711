"""The seed article's DriftMatrix rows for its five models, and for the models issue 20 added, as the code at these
versions gives them.

For each model: whitespace in reasoning and after `</think>`, reasoning truncation, tool-call fault tolerance and
argument serialization, through the template alone (`raw`) and through vLLM 0.33.0, SGLang 0.5.23 and 0.5.12.
Each row is (model, scenario, engine, status, "stage kind location" of the cause, or the error's sentence head).
Where the code disagrees with the article, the row follows the code; docs/FINDINGS.md says where and why.
History-thinking retention and its kwargs are pinned in tests/test_simulate.py.
"""

from __future__ import annotations

import os

import pytest

from engine.simulate import run_cell

ROWS = [
    ('qwen3.6', 'reasoning-whitespace', 'raw', 'breaks', 'template reasoning-trimmed Qwen-Qwen3.6-35B-A3B.jinja:99'),
    ('qwen3.6', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'template reasoning-trimmed Qwen-Qwen3.6-35B-A3B.jinja:99'),
    ('qwen3.6', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'template reasoning-trimmed Qwen-Qwen3.6-35B-A3B.jinja:99'),
    ('qwen3.6', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'template reasoning-trimmed Qwen-Qwen3.6-35B-A3B.jinja:99'),
    ('qwen3.6', 'newline-after-think', 'raw', 'breaks', 'template scaffold-changed Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template scaffold-changed Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template scaffold-changed Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template scaffold-changed Qwen-Qwen3.6-35B-A3B.jinja:101'),
    ('qwen3.6', 'reasoning-truncated', 'raw', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'tool-call-truncated', 'raw', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped Qwen-Qwen3.6-35B-A3B.jinja:100-103'),
    ('qwen3.6', 'args-serialization', 'raw', 'holds', None),
    ('qwen3.6', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args-type-coerced vllm/parser/engine/parser_engine.py:437-462'),
    ('qwen3.6', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-type-coerced sglang/srt/function_call/qwen3_coder_detector.py:229'),
    ('qwen3.6', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-type-coerced sglang/srt/function_call/qwen3_coder_detector.py:157'),
    ('glm-5.1', 'reasoning-whitespace', 'raw', 'holds', None),
    ('glm-5.1', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning-trimmed vllm/parser/engine/parser_engine.py:587'),
    ('glm-5.1', 'reasoning-whitespace', 'sglang@0.5.23', 'holds', None),
    ('glm-5.1', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning-trimmed sglang/srt/parser/reasoning_parser.py:101'),
    ('glm-5.1', 'newline-after-think', 'raw', 'breaks', 'template whitespace-normalised zai-org-GLM-5.1.jinja:80-81'),
    ('glm-5.1', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template whitespace-normalised zai-org-GLM-5.1.jinja:80-81'),
    ('glm-5.1', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template whitespace-normalised zai-org-GLM-5.1.jinja:80-81'),
    ('glm-5.1', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template whitespace-normalised zai-org-GLM-5.1.jinja:80-81'),
    ('glm-5.1', 'reasoning-truncated', 'raw', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'tool-call-truncated', 'raw', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped zai-org-GLM-5.1.jinja:75-78'),
    ('glm-5.1', 'args-serialization', 'raw', 'holds', None),
    ('glm-5.1', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args-type-coerced vllm/parser/engine/parser_engine.py:1191'),
    ('glm-5.1', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-type-coerced sglang/srt/function_call/glm47_moe_detector.py:249-298'),
    ('glm-5.1', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-type-coerced sglang/srt/function_call/glm47_moe_detector.py:763'),
    ('kimi-k2.6', 'reasoning-whitespace', 'raw', 'holds', None),
    ('kimi-k2.6', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning-trimmed vllm/parser/engine/parser_engine.py:587'),
    ('kimi-k2.6', 'reasoning-whitespace', 'sglang@0.5.23', 'holds', None),
    ('kimi-k2.6', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning-trimmed sglang/srt/parser/reasoning_parser.py:101'),
    ('kimi-k2.6', 'newline-after-think', 'raw', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'parser whitespace-normalised vllm/parser/engine/incremental_lexer.py:254'),
    ('kimi-k2.6', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'parser call-id-renumbered sglang/srt/entrypoints/openai/serving_chat.py:3129-3147'),
    ('kimi-k2.6', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'parser whitespace-normalised sglang/srt/parser/reasoning_parser.py:101'),
    ('kimi-k2.6', 'reasoning-truncated', 'raw', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'tool-call-truncated', 'raw', 'holds', None),
    ('kimi-k2.6', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser args-dropped vllm/renderers/hf.py:1104'),
    ('kimi-k2.6', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped moonshotai-Kimi-K2.6.jinja:43-47'),
    ('kimi-k2.6', 'args-serialization', 'raw', 'holds', None),
    ('kimi-k2.6', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template args-reserialised moonshotai-Kimi-K2.6.jinja:34'),
    ('kimi-k2.6', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-reserialised sglang/srt/entrypoints/openai/serving_chat.py:181-194'),
    ('kimi-k2.6', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-reserialised sglang/srt/entrypoints/openai/serving_chat.py:516'),
    ('deepseek-v4', 'reasoning-whitespace', 'raw', 'holds', None),
    ('deepseek-v4', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'parser reasoning-trimmed vllm/parser/engine/parser_engine.py:587'),
    ('deepseek-v4', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'parser reasoning-trimmed sglang/srt/parser/deepseek_recipe_output.py:202'),
    ('deepseek-v4', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'parser reasoning-trimmed sglang/srt/parser/reasoning_parser.py:101'),
    ('deepseek-v4', 'newline-after-think', 'raw', 'holds', None),
    ('deepseek-v4', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'parser whitespace-normalised vllm/parser/engine/incremental_lexer.py:254'),
    ('deepseek-v4', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'parser whitespace-normalised sglang/srt/parser/deepseek_recipe_output.py:202'),
    ('deepseek-v4', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'parser whitespace-normalised sglang/srt/parser/reasoning_parser.py:101'),
    ('deepseek-v4', 'reasoning-truncated', 'raw', 'holds', None),
    ('deepseek-v4', 'reasoning-truncated', 'vllm@0.33.0', 'holds', None),
    ('deepseek-v4', 'reasoning-truncated', 'sglang@0.5.23', 'holds', None),
    ('deepseek-v4', 'reasoning-truncated', 'sglang@0.5.12', 'holds', None),
    ('deepseek-v4', 'tool-call-truncated', 'raw', 'holds', None),
    ('deepseek-v4', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser args-dropped vllm/parser/deepseek_v4.py:112'),
    # deepseek-recipe takes the truncated arguments but refuses a call without a result (the client's next user turn)
    ('deepseek-v4', 'tool-call-truncated', 'sglang@0.5.23', 'error', "deepseek-v4: sglang 0.5.23 refuses the request: An assistant message with 'tool_calls' must be followed by tool messages"),
    ('deepseek-v4', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'parser text-rewritten sglang/srt/parser/reasoning_parser.py:101'),
    ('deepseek-v4', 'args-serialization', 'raw', 'breaks', 'template args-reserialised encoding_dsv4.py:162'),
    ('deepseek-v4', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args-type-coerced vllm/parser/engine/parser_engine.py:1191'),
    ('deepseek-v4', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template args-reserialised sglang/srt/entrypoints/openai/serving_deepseek_recipe.py:144'),
    ('deepseek-v4', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template args-reserialised sglang/srt/entrypoints/openai/encoding_dsv4.py:162'),
    ('gpt-oss', 'reasoning-whitespace', 'raw', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'template scaffold-changed openai-harmony 0.0.8 (vllm 0.33.0 parse_chat_inputs_to_harmony_messages):0'),
    ('gpt-oss', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'raw', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template scaffold-changed openai-harmony 0.0.8 (vllm 0.33.0 parse_chat_inputs_to_harmony_messages):0'),
    ('gpt-oss', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'reasoning-truncated', 'raw', 'error', 'openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314'),
    ('gpt-oss', 'reasoning-truncated', 'vllm@0.33.0', 'holds', None),
    ('gpt-oss', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped openai-gpt-oss-120b.jinja:302-311'),
    ('gpt-oss', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped openai-gpt-oss-120b.jinja:302-311'),
    ('gpt-oss', 'tool-call-truncated', 'raw', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template scaffold-changed openai-harmony 0.0.8 (vllm 0.33.0 parse_chat_inputs_to_harmony_messages):0'),
    ('gpt-oss', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped openai-gpt-oss-120b.jinja:302-311'),
    ('gpt-oss', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped openai-gpt-oss-120b.jinja:302-311'),
    ('gpt-oss', 'args-serialization', 'raw', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template scaffold-changed openai-harmony 0.0.8 (vllm 0.33.0 parse_chat_inputs_to_harmony_messages):0'),
    ('gpt-oss', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    ('gpt-oss', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template scaffold-changed openai-gpt-oss-120b.jinja:296'),
    # Issue 20's models (the scenarios that vary reasoning are unavailable for those that write none: test_check).
    ('qwen3-coder', 'tool-call-truncated', 'raw', 'holds', None),
    ('qwen3-coder', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser args-dropped vllm/parser/qwen3.py:87'),
    ('qwen3-coder', 'tool-call-truncated', 'sglang@0.5.23', 'holds', None),
    ('qwen3-coder', 'tool-call-truncated', 'sglang@0.5.12', 'holds', None),
    ('qwen3-coder', 'args-serialization', 'raw', 'holds', None),
    ('qwen3-coder', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args-type-coerced vllm/parser/engine/parser_engine.py:1191'),
    ('qwen3-coder', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-type-coerced sglang/srt/function_call/qwen3_coder_detector.py:163'),
    ('qwen3-coder', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-type-coerced sglang/srt/function_call/qwen3_coder_detector.py:157'),
    ('qwen3-2507', 'tool-call-truncated', 'raw', 'holds', None),
    ('qwen3-2507', 'tool-call-truncated', 'vllm@0.33.0', 'holds', None),
    ('qwen3-2507', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'parser call-lost sglang/srt/entrypoints/openai/serving_chat.py:2962'),
    ('qwen3-2507', 'tool-call-truncated', 'sglang@0.5.12', 'holds', None),
    ('qwen3-2507', 'args-serialization', 'raw', 'breaks', 'template args-reserialised Qwen-Qwen3-4B-Instruct-2507.jinja:41'),
    ('qwen3-2507', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template args-reserialised Qwen-Qwen3-4B-Instruct-2507.jinja:41'),
    ('qwen3-2507', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template args-reserialised Qwen-Qwen3-4B-Instruct-2507.jinja:41'),
    ('qwen3-2507', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template args-reserialised Qwen-Qwen3-4B-Instruct-2507.jinja:41'),
    ('qwen2.5', 'tool-call-truncated', 'raw', 'breaks', 'template args-reserialised Qwen-Qwen2.5-7B-Instruct.jinja:36'),
    ('qwen2.5', 'tool-call-truncated', 'vllm@0.33.0', 'holds', None),
    ('qwen2.5', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'parser call-lost sglang/srt/entrypoints/openai/serving_chat.py:2962'),
    ('qwen2.5', 'tool-call-truncated', 'sglang@0.5.12', 'holds', None),
    ('qwen2.5', 'args-serialization', 'raw', 'breaks', 'template args-reserialised Qwen-Qwen2.5-7B-Instruct.jinja:36'),
    ('qwen2.5', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template args-reserialised Qwen-Qwen2.5-7B-Instruct.jinja:36'),
    ('qwen2.5', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template args-reserialised Qwen-Qwen2.5-7B-Instruct.jinja:36'),
    ('qwen2.5', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template args-reserialised Qwen-Qwen2.5-7B-Instruct.jinja:36'),
    ('glm-4.7-flash', 'reasoning-whitespace', 'raw', 'breaks', 'template reasoning-trimmed GLM-4.7-Flash.jinja:53'),
    ('glm-4.7-flash', 'reasoning-whitespace', 'vllm@0.33.0', 'breaks', 'template reasoning-trimmed GLM-4.7-Flash.jinja:53'),
    ('glm-4.7-flash', 'reasoning-whitespace', 'sglang@0.5.23', 'breaks', 'template reasoning-trimmed GLM-4.7-Flash.jinja:53'),
    ('glm-4.7-flash', 'reasoning-whitespace', 'sglang@0.5.12', 'breaks', 'template reasoning-trimmed GLM-4.7-Flash.jinja:53'),
    ('glm-4.7-flash', 'newline-after-think', 'raw', 'breaks', 'template whitespace-normalised GLM-4.7-Flash.jinja:57-58'),
    ('glm-4.7-flash', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'template whitespace-normalised GLM-4.7-Flash.jinja:57-58'),
    ('glm-4.7-flash', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template whitespace-normalised GLM-4.7-Flash.jinja:57-58'),
    ('glm-4.7-flash', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template whitespace-normalised GLM-4.7-Flash.jinja:57-58'),
    ('glm-4.7-flash', 'reasoning-truncated', 'raw', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'reasoning-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'reasoning-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'reasoning-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'tool-call-truncated', 'raw', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'tool-call-truncated', 'sglang@0.5.12', 'breaks', 'template reasoning-dropped GLM-4.7-Flash.jinja:52-55'),
    ('glm-4.7-flash', 'args-serialization', 'raw', 'holds', None),
    ('glm-4.7-flash', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser args-type-coerced vllm/parser/engine/parser_engine.py:1191'),
    ('glm-4.7-flash', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-type-coerced sglang/srt/function_call/glm47_moe_detector.py:249-298'),
    ('glm-4.7-flash', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-type-coerced sglang/srt/function_call/glm47_moe_detector.py:763'),
    ('deepseek-v3.1', 'tool-call-truncated', 'raw', 'breaks', 'template args-reserialised deepseek-ai-DeepSeek-V3.1.jinja:38-39'),
    ('deepseek-v3.1', 'tool-call-truncated', 'vllm@0.33.0', 'breaks', 'parser call-lost vllm/parser/abstract_parser.py:850'),
    ('deepseek-v3.1', 'tool-call-truncated', 'sglang@0.5.23', 'breaks', 'parser call-lost sglang/srt/entrypoints/openai/serving_chat.py:2962'),
    ('deepseek-v3.1', 'tool-call-truncated', 'sglang@0.5.12', 'holds', None),
    ('deepseek-v3.1', 'args-serialization', 'raw', 'breaks', 'template args-reserialised deepseek-ai-DeepSeek-V3.1.jinja:38'),
    ('deepseek-v3.1', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template args-reserialised deepseek-ai-DeepSeek-V3.1.jinja:38'),
    ('deepseek-v3.1', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template args-reserialised deepseek-ai-DeepSeek-V3.1.jinja:38'),
    ('deepseek-v3.1', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template args-reserialised deepseek-ai-DeepSeek-V3.1.jinja:38'),
    # Part 2 (docs/FINDINGS.md): MiniMax through vLLM loses `</think>` on a call turn, SGLang's append-think keeps it;
    # DeepSeek V3.2 with thinking off breaks in its template; Llama re-serialises and refuses parallel calls; Mistral's
    # template inserts [CALL_ID] and refuses SGLang's ids; vLLM's mistral parser (run against the mistral_common
    # 0.33.0 requires) makes 9-alphanumeric ids, which it takes, so vLLM breaks where SGLang errors.
    ('minimax-m2.7', 'tool-call', 'raw', 'holds', None),
    ('minimax-m2.7', 'tool-call', 'vllm@0.33.0', 'breaks', 'parser reasoning-dropped vllm/reasoning/minimax_m2_reasoning_parser.py:61'),
    ('minimax-m2.7', 'tool-call', 'sglang@0.5.23', 'holds', None),
    ('minimax-m2.7', 'tool-call', 'sglang@0.5.12', 'holds', None),
    ('minimax-m2.7', 'args-serialization', 'raw', 'holds', None),
    ('minimax-m2.7', 'args-serialization', 'vllm@0.33.0', 'breaks', 'parser reasoning-dropped vllm/reasoning/minimax_m2_reasoning_parser.py:61'),
    ('minimax-m2.7', 'args-serialization', 'sglang@0.5.23', 'breaks', 'parser args-type-coerced sglang/srt/function_call/minimax_m2.py:194'),
    ('minimax-m2.7', 'args-serialization', 'sglang@0.5.12', 'breaks', 'parser args-type-coerced sglang/srt/function_call/minimax_m2.py:193'),
    ('minimax-m2.7', 'client-drops-reasoning', 'raw', 'breaks', 'client client-dropped-field scenarios/client-drops-reasoning.yaml:6'),
    ('minimax-m2.7', 'client-drops-reasoning', 'vllm@0.33.0', 'breaks', 'template generation-prompt-differs MiniMaxAI-MiniMax-M2.7.jinja:158'),
    ('minimax-m2.7', 'client-drops-reasoning', 'sglang@0.5.23', 'holds', None),
    ('minimax-m2.7', 'client-drops-reasoning', 'sglang@0.5.12', 'holds', None),
    ('minimax-m2.7', 'newline-after-think', 'raw', 'breaks', 'template scaffold-changed MiniMaxAI-MiniMax-M2.7.jinja:98'),
    ('minimax-m2.7', 'newline-after-think', 'vllm@0.33.0', 'breaks', 'parser reasoning-dropped vllm/reasoning/minimax_m2_reasoning_parser.py:61'),
    ('minimax-m2.7', 'newline-after-think', 'sglang@0.5.23', 'breaks', 'template scaffold-changed MiniMaxAI-MiniMax-M2.7.jinja:98'),
    ('minimax-m2.7', 'newline-after-think', 'sglang@0.5.12', 'breaks', 'template scaffold-changed MiniMaxAI-MiniMax-M2.7.jinja:98'),
    ('deepseek-v3.2', 'tool-call', 'raw', 'breaks', 'template generation-prompt-differs deepseek-ai-DeepSeek-V3.2.jinja:132'),
    # vLLM (its deepseek_v32 tokenizer mode) and SGLang render V3.2 through their bundled V3.2 encoders, which write
    # `</think>` alone in chat mode both times
    ('deepseek-v3.2', 'tool-call', 'vllm@0.33.0', 'holds', None),
    ('deepseek-v3.2', 'tool-call', 'sglang@0.5.23', 'holds', None),
    ('deepseek-v3.2', 'tool-call', 'sglang@0.5.12', 'holds', None),
    ('llama-3.1', 'args-serialization', 'raw', 'breaks', 'template args-reserialised meta-llama-Llama-3.1-8B-Instruct.jinja:88'),
    ('llama-3.1', 'args-serialization', 'vllm@0.33.0', 'breaks', 'template args-reserialised meta-llama-Llama-3.1-8B-Instruct.jinja:88'),
    ('llama-3.1', 'args-serialization', 'sglang@0.5.23', 'breaks', 'template args-reserialised meta-llama-Llama-3.1-8B-Instruct.jinja:88'),
    ('llama-3.1', 'args-serialization', 'sglang@0.5.12', 'breaks', 'template args-reserialised meta-llama-Llama-3.1-8B-Instruct.jinja:88'),
    ('llama-3.1', 'parallel-tool-calls', 'raw', 'error', 'meta-llama-Llama-3.1-8B-Instruct.jinja for model llama-3.1 r'),
    ('llama-3.1', 'parallel-tool-calls', 'vllm@0.33.0', 'error', 'meta-llama-Llama-3.1-8B-Instruct.jinja for model llama-3.1 r'),
    ('llama-3.1', 'parallel-tool-calls', 'sglang@0.5.23', 'error', 'meta-llama-Llama-3.1-8B-Instruct.jinja for model llama-3.1 r'),
    ('llama-3.1', 'parallel-tool-calls', 'sglang@0.5.12', 'error', 'meta-llama-Llama-3.1-8B-Instruct.jinja for model llama-3.1 r'),
    ('llama-3.1', 'tool-call', 'raw', 'holds', None),
    ('llama-3.1', 'tool-call', 'vllm@0.33.0', 'holds', None),
    ('llama-3.1', 'tool-call', 'sglang@0.5.23', 'holds', None),
    ('llama-3.1', 'tool-call', 'sglang@0.5.12', 'holds', None),
    ('mistral-small-3.2', 'tool-call', 'raw', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:93'),
    ('mistral-small-3.2', 'tool-call', 'vllm@0.33.0', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:93'),
    ('mistral-small-3.2', 'tool-call', 'sglang@0.5.23', 'error', 'Mistral-Small-3.2-24B-Instruct-2506.jinja for model mistral-'),
    ('mistral-small-3.2', 'tool-call', 'sglang@0.5.12', 'error', 'Mistral-Small-3.2-24B-Instruct-2506.jinja for model mistral-'),
    ('mistral-small-3.2', 'tool-call-id', 'raw', 'error', 'Mistral-Small-3.2-24B-Instruct-2506.jinja for model mistral-'),
    ('mistral-small-3.2', 'tool-call-id', 'vllm@0.33.0', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:93'),
    ('mistral-small-3.2', 'tool-call-truncated', 'vllm@0.33.0', 'error', 'Mistral-Small-3.2-24B-Instruct-2506.jinja for model mistral-'),
    ('mistral-small-3.2', 'no-tools-next-user', 'vllm@0.33.0', 'holds', None),
    ('mistral-small-3.2', 'content-truncated', 'raw', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:68-69'),
    ('mistral-small-3.2', 'content-truncated', 'vllm@0.33.0', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:68-69'),
    ('mistral-small-3.2', 'content-truncated', 'sglang@0.5.23', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:68-69'),
    ('mistral-small-3.2', 'content-truncated', 'sglang@0.5.12', 'breaks', 'template scaffold-changed Mistral-Small-3.2-24B-Instruct-2506.jinja:68-69'),
]


@pytest.mark.parametrize(("model", "scenario", "engine", "status", "cause"), ROWS,
                         ids=[f"{r[0]}/{r[1]}/{r[2]}" for r in ROWS])
def test_drift_matrix_row(model: str, scenario: str, engine: str, status: str, cause: str | None) -> None:
    cell = run_cell(model, scenario, engine)
    if cell.status == "unavailable" and "whose source is not here" in (cell.note or ""):
        pytest.skip(cell.note)  # the engine's own encoder: its wheel is neither cached nor fetchable (offline)
    if cell.status == "error" and "is stubbed in this worker" in (cell.note or "") and os.environ.get("CI") != "true":
        pytest.skip(cell.note)  # a dependency the release pins (mistral_common) is neither cached nor fetchable
    assert cell.status == status
    if cell.status == "error":
        assert cell.note is not None and cell.note.startswith(cause)
    else:
        c = cell.cause
        assert (f"{c.stage} {c.kind} {c.location}" if c else None) == cause


def test_article_vs_code_reasoning_whitespace() -> None:
    """The article: vLLM's reasoning parsers are zero-drift, SGLang strips. At these versions it is the reverse for
    GLM, Kimi and DeepSeek: vLLM's declarative parser engine rstrips reasoning (Qwen3 turns it off), SGLang 0.5.23
    no longer strips GLM and Kimi (0.5.12 did) but trims DeepSeek V4, whose output it parses through deepseek-recipe
    (its own code, the line that reads the recipe's reasoning)."""
    for model in ("glm-5.1", "kimi-k2.6", "deepseek-v4"):
        vllm = run_cell(model, "reasoning-whitespace", "vllm@0.33.0").cause  # the release's own code, traced
        assert vllm.kind == "reasoning-trimmed"
        if model != "deepseek-v4":  # its traced parse overflows the tracer's 5000 edits: no line is cited
            assert str(vllm.location) == "vllm/parser/engine/parser_engine.py:587"
        sglang = run_cell(model, "reasoning-whitespace", "sglang@0.5.23")
        if model == "deepseek-v4":
            assert (sglang.cause.kind, str(sglang.cause.location)) == ("reasoning-trimmed",
                                                                  "sglang/srt/parser/deepseek_recipe_output.py:202")
        else:
            assert sglang.status == "holds"
        old = run_cell(model, "reasoning-whitespace", "sglang@0.5.12").cause  # its own code, traced
        assert (old.kind, str(old.location)) == ("reasoning-trimmed", "sglang/srt/parser/reasoning_parser.py:101")
    assert run_cell("qwen3.6", "reasoning-whitespace", "vllm@0.33.0").cause.stage == "template"


def test_article_vs_code_kimi_arguments() -> None:
    """The article: Kimi's parsers keep the model's JSON string. vLLM 0.33.0 re-dumps it (schema coercion, json.dumps'
    spacing) and its request side parses it into a dict, which the template prints with `|tojson` (line 34): printing
    the model's own text there keeps the prefix. SGLang's request side parses it into a dict (undoing that keeps it)."""
    assert run_cell("kimi-k2.6", "args-serialization", "raw").status == "holds"
    vllm = run_cell("kimi-k2.6", "args-serialization", "vllm@0.33.0").cause
    assert (vllm.stage, vllm.kind, str(vllm.location)) == ("template", "args-reserialised", "moonshotai-Kimi-K2.6.jinja:34")
    assert vllm.locations[0].text == "tool_call['function']['arguments']|tojson"
    sglang = run_cell("kimi-k2.6", "args-serialization", "sglang@0.5.23").cause
    assert (sglang.kind, sglang.edit.step) == ("args-reserialised", "args_orjson_loads")


def test_a_client_that_drops_reasoning_is_the_cause_where_the_template_would_keep_it() -> None:
    # The scenario's client sends the assistant turn back without reasoning_content. Re-run with a client that echoes
    # everything: where that holds, the client is the cause (its setting's line in the scenario file).
    for model in ("qwen3.6", "glm-5.1", "kimi-k2.6", "deepseek-v4"):
        cause = run_cell(model, "client-drops-reasoning", "vllm").cause
        assert (cause.stage, cause.kind, str(cause.location)) == (
            "client", "client-dropped-field", "scenarios/client-drops-reasoning.yaml:6")
        assert cause.line_text == "send_reasoning: false   # the OpenAI-style client keeps content and tool_calls only"
        assert cause.fix.to_json() == {
            "kind": "client", "setting": "send_reasoning", "value": True,
            "text": "send the assistant turn back whole (send_reasoning=true)", "changes_behaviour": False,
            "proof": "re-run with a client that echoes what the engine returned: the boundary holds "
                     f"({cause.proof.rsplit('(', 1)[1]}"}
    # GPT-OSS: with the reasoning echoed, the boundary still breaks, later, where the template re-renders the history
    # call in another form; the first break is the client's.
    gpt_oss = run_cell("gpt-oss", "client-drops-reasoning", "vllm").cause
    assert (gpt_oss.stage, gpt_oss.kind) == ("client", "client-dropped-field")
    assert gpt_oss.proof.startswith("re-run with a client that echoes what the engine returned: the break moves from")
    assert run_cell("qwen3.6", "client-drops-reasoning", "bridge").status == "holds"
