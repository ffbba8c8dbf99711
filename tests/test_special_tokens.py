"""The special tokens a release's worker is told about (AddedVocab.special, what its stand-in tokenizer lists in
all_special_tokens) are those a real Hugging Face tokenizer of the model lists: transformers loading the model's
tokenizer.json with the tokenizer_config.json its package ships beside it. vLLM's parser engine drops every listed
token that is not in its grammar (streaming_parser_engine.py _build_drop_info), so one listed too many is a wrong
answer (DeepSeek V3.2's ｜DSML｜) and, for DeepSeek's ~1,230 flagged placeholders, a regex and a lexer terminal each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.assets import package_file
from engine.models import load_model, load_spec, model_ids
from engine.serving.real.backend import AddedVocab


def _config_beside_tokenizer(model_id: str) -> Path | None:
    asset = load_spec(model_id).assets["tokenizer"]
    if asset.kind != "tokenizer.json" or not asset.package:
        return None
    config = package_file(asset.package, asset.path).parent / "tokenizer_config.json"
    return config if config.is_file() else None


MODELS = [m for m in model_ids() if _config_beside_tokenizer(m) is not None]


def test_the_packaged_models_are_checked() -> None:
    assert {"deepseek-v4", "deepseek-v3.2", "deepseek-v3.1", "qwen3.6", "glm-5.1", "minimax-m2.7"} <= set(MODELS)


@pytest.mark.parametrize("model_id", MODELS)
def test_the_workers_special_tokens_are_what_transformers_lists(model_id: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    vocab = AddedVocab.from_tokenizer(load_model(model_id).tokenizer)
    assert vocab is not None and vocab.tokenizer_json is not None
    shutil.copy(vocab.tokenizer_json, tmp_path / "tokenizer.json")
    config = json.loads(_config_beside_tokenizer(model_id).read_text(encoding="utf-8"))
    config.pop("tokenizer_class", None)  # the generic fast tokenizer over tokenizer.json (Qwen2Tokenizer re-splits)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    real = AutoTokenizer.from_pretrained(str(tmp_path))
    assert vocab.special == set(real.all_special_tokens) & vocab.ids.keys()
    assert all(real.convert_tokens_to_ids(token) == vocab.ids[token] for token in vocab.special)


def test_deepseek_lists_bos_and_eos_only() -> None:
    for model_id in ("deepseek-v4", "deepseek-v3.2"):
        vocab = AddedVocab.from_tokenizer(load_model(model_id).tokenizer)
        assert vocab.special == {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"}
        assert "｜DSML｜" in vocab.ids


def test_the_workers_tokenizer_file_is_named_by_the_checked_tokenizer_json(tmp_path: Path, monkeypatch) -> None:
    """Written once per machine under the sha256 of the tokenizer.json the model loaded (serialising a tokenizer to
    name its file cost a fresh process 0.7-2 s a model), and it is that tokenizer."""
    from tokenizers import Tokenizer

    from engine.models import build_tokenizer
    from engine.serving.real.backend import tokenizer_file

    monkeypatch.setenv("DRIFT_ENGINE_CACHE", str(tmp_path))
    tokenizer, asset = build_tokenizer(load_spec("qwen2.5"))
    written = Path(tokenizer_file.__wrapped__(tokenizer.inner))
    assert written == tmp_path / "tokenizers" / f"from-{asset.sha256}.json"
    modified = written.stat().st_mtime_ns
    assert tokenizer_file.__wrapped__(tokenizer.inner) == str(written) and written.stat().st_mtime_ns == modified
    again = Tokenizer.from_file(str(written))
    assert again.encode("<|im_start|>user\nZürich 東京<|im_end|>").ids == \
        list(tokenizer.encode("<|im_start|>user\nZürich 東京<|im_end|>").ids)
