"""Segment-cached tokenization gives exactly the ids and offsets of whole-string tokenization, where it is proven.

Checked on every string the default matrix tokenizes (each boundary's previous prompt, completion, previous prompt +
completion, next prompt) and on every render of the render-parity conversations, for every model with a tokenizer,
plus adversarial strings built from each tokenizer's own added tokens. The proof is checked the other way too: a
configuration that breaks it is detected, and there the naive split really does differ.
"""

from __future__ import annotations

import copy
import json
import random
import re
from functools import cache

import pytest
from conversations import CONVERSATIONS

from engine.assets import resolve_asset
from engine.errors import AssetError
from engine.matrix import default_request, run_matrix
from engine.models import default_model_ids, load_model, load_spec
from engine.tokenize import (
    HFTokenizer,
    SegmentCachedTokenizer,
    SegmentPlan,
    hf_segment_config,
    hf_segment_plan,
    hf_segment_proof,
    leftmost_longest_pattern,
    segment_cached_hf,
    tiktoken_segment_proof,
)


def has_tokenizer(model_id: str) -> bool:
    """Whether the model's tokenizer file is here (read and its sha256 checked, not loaded: collecting the suite loads
    no tokenizer; test_every_default_tokenizer_is_proven_and_kimi_would_not_be checks this against load_model)."""
    spec = load_spec(model_id)
    try:
        resolve_asset(spec.id, spec.hub_repo, spec.assets["tokenizer"])
    except AssetError:
        return False
    return True


TOKENIZED = [m for m in default_model_ids() if has_tokenizer(m)]


def fresh(model_id: str) -> SegmentCachedTokenizer:
    """A wrapper with empty caches over the model's real tokenizer."""
    tokenizer = load_model(model_id).tokenizer
    assert isinstance(tokenizer, SegmentCachedTokenizer)
    return SegmentCachedTokenizer(tokenizer.inner, tokenizer.plan, name=tokenizer.name)


@cache
def matrix_strings() -> dict[str, list[str]]:
    strings: dict[str, dict[str, None]] = {m: {} for m in TOKENIZED}
    for cell in run_matrix(default_request()):
        if cell.model not in strings:
            continue
        for b in cell.boundaries:
            for text in (b.prev_prompt.text, b.completion.text, b.prev_text, b.next_prompt.text):
                strings[cell.model][text] = None
    return {m: list(texts) for m, texts in strings.items()}


def rendered_conversations(model_id: str) -> list[str]:
    model = load_model(model_id)
    out = []
    for messages, tools in CONVERSATIONS.values():
        for generation_prompt in (True, False):
            try:
                out.append(model.renderer.render(messages, tools, add_generation_prompt=generation_prompt,
                                                 kwargs=model.spec.default_kwargs()).text)
            except Exception:  # noqa: BLE001 - a template refusing a shape is test_render's business
                continue
    return out


def adversarial(model_id: str) -> list[str]:
    """Added tokens next to spaces, newlines, each other, halves of themselves, combining marks and wide text."""
    tokenizer = load_model(model_id).tokenizer
    # Only tokens that decode to themselves: tiktoken's o200k_harmony names id 200018 twice (<|endofprompt|> and
    # <|reserved_200018|>), and TiktokenTokenizer's offsets cannot place the alias (it raises on it, whole or not).
    added = sorted({content for _, ids in tokenizer.plan.passes for content, token_id in ids.items()
                    if tokenizer.decode([token_id]) == content})
    # Every named token; of the ~1,000 numbered ones (<|reserved_N|>, <｜place▁holder▁no▁N｜>) every 40th.
    numbered = [t for t in added if re.search(r"reserved|place▁holder", t)]
    added = [t for t in added if t not in set(numbered)] + numbered[::40]
    out = ["", " ", "\n", "\r\n", "😀", "東京 São Zürich", "a\u0301", "\u0301"]
    for t in added:
        out += [t, f" {t} ", f"\n{t}\n", f"a{t}b", f"{t}{t}", f"{t} {t}", t[:-1], t[1:], f"{t[:-1]} {t}",
                f"{t}\u0301", f"é{t}é", f"  {t}\t", f"{t}😀", f"东京{t}東京", f"{t[: len(t) // 2]}{t}{t[len(t) // 2:]}"]
    # Every added token at once, glued and spaced: the splitter must find them in order, leftmost-longest.
    out += ["".join(added), " ".join(added), "\n".join(added[::-1])]
    return out


def assert_same(model_id: str, texts: list[str]) -> SegmentCachedTokenizer:
    wrapper = fresh(model_id)
    inner = wrapper.inner
    mismatches = []
    for text in texts:
        whole = inner.encode(text)
        ours = wrapper.encode(text)
        if ours.ids != whole.ids or ours.offsets != whole.offsets or wrapper.encode_ids(text) != whole.ids:
            mismatches.append(text[:80])
    assert mismatches == []
    return wrapper


@pytest.mark.parametrize("model_id", TOKENIZED)
def test_every_matrix_string_tokenizes_as_whole(model_id: str) -> None:
    texts = matrix_strings()[model_id]
    assert len(texts) > 30  # a model that does not think runs 10 of the 14 scenarios
    wrapper = assert_same(model_id, texts)
    stats = wrapper.cache_stats()
    # The ids path was answered from reused pieces, not from whole strings.
    assert wrapper.plan.proven
    assert stats["segment_hits"] > stats["segment_misses"]


@pytest.mark.parametrize("model_id", TOKENIZED)
def test_rendered_conversations_tokenize_as_whole(model_id: str) -> None:
    texts = rendered_conversations(model_id)
    assert len(texts) >= 8
    assert_same(model_id, texts)


@pytest.mark.parametrize("model_id", TOKENIZED)
def test_adversarial_strings_tokenize_as_whole(model_id: str) -> None:
    assert_same(model_id, adversarial(model_id))


def extending_chain(model_id: str) -> list[str]:
    """Texts each made from the one before, as a session's prompts are, and edited where it is hard: an added
    token completed, cut or glued across the point where the two texts stop agreeing, history rewritten early."""
    rng = random.Random(19)
    texts = rendered_conversations(model_id)[:6] + matrix_strings()[model_id][:30]
    added = [t for t in adversarial(model_id) if t][:200]
    chain, text = [], ""
    for _ in range(240):
        token = rng.choice(added)
        cut = rng.randrange(len(text) + 1)
        text = rng.choice([
            text + rng.choice(texts),  # a whole next request appended
            text + token,
            text[:cut] + token + text[cut:],  # rewritten somewhere before the end
            text[:cut],
            text[:-1] if text else token,  # the last character of an added token dropped ...
            text + token[len(token) // 2:],  # ... or its second half glued on
            text + token[:-1], text + token[-1:],
        ])
        chain.append(text)
    return chain


@pytest.mark.parametrize("model_id", TOKENIZED)
def test_extending_tokenization_is_whole_string_tokenization(model_id: str) -> None:
    # Each text tokenized against the one before (sometimes against none, or an older one), as a session does.
    wrapper = fresh(model_id)
    chain = extending_chain(model_id)
    states: list = []
    mismatches = []
    for n, text in enumerate(chain):
        if not states or n % 14 == 0:
            previous = None
        else:
            previous = states[n // 2] if n % 7 == 0 else states[-1]
        state = wrapper.encode_extending(text, previous)
        if state.ids.materialize() != wrapper.inner.encode(text).ids or state.chars.materialize() != text:
            mismatches.append(n)
        states.append(state)
    assert mismatches == []
    # What the texts share is shared, not copied: the chain's ids hold fewer tokens than the texts do.
    assert sum(len(s.ids.tail) for s in states) < sum(s.ids.length for s in states) / 2


def test_every_default_tokenizer_is_proven_and_kimi_would_not_be() -> None:
    assert TOKENIZED == [m for m in default_model_ids() if load_model(m).tokenizer is not None]
    assert {m: fresh(m).plan.proven for m in TOKENIZED} == {m: True for m in TOKENIZED}
    assert set(TOKENIZED) == {"qwen3.6", "qwen3.5", "glm-5.1", "deepseek-v4", "gpt-oss", "qwen3-coder", "qwen3-2507",
                              "qwen2.5", "glm-4.7-flash", "deepseek-v3.1", "minimax-m2.7", "deepseek-v3.2"}
    # DeepSeek has added tokens with normalized=true: proven only because its normalizer is an empty Sequence,
    # and matched in a second pass as tokenizers does.
    assert [len(ids) for _, ids in fresh("deepseek-v4").plan.passes] == [1237, 46]
    # Kimi's tokenization_kimi.py cuts long runs over the whole text first.
    assert tiktoken_segment_proof({"<|im_end|>": 1}, 25000) == (
        "runs of more than 25000 whitespace / non-whitespace characters are cut over the whole text before "
        "encoding, and a run can cross a special token")


def qwen_config() -> dict:
    tokenizer = load_model("qwen3.6").tokenizer
    return copy.deepcopy(hf_segment_config(tokenizer.inner.backend))


@pytest.mark.parametrize(("change", "reason"), [
    (lambda c: c["added_tokens"][0].update(lstrip=True),
     "added token '<|endoftext|>' has lstrip=true, so its match depends on the text around it"),
    (lambda c: c["added_tokens"][1].update(rstrip=True, single_word=True),
     "added token '<|im_start|>' has rstrip/single_word=true, so its match depends on the text around it"),
    (lambda c: c["added_tokens"][2].update(normalized=True),
     "added token '<|im_end|>' has normalized=true and the normalizer changes text, so it is matched on "
     "normalized text"),
    (lambda c: c.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}),
     "the Metaspace pre-tokenizer prepends only to the first piece (prepend_scheme 'first')"),
    (lambda c: c.update(post_processor={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True}),
     "its ByteLevel post-processor trims the first token's offsets differently (trim_offsets and "
     "add_prefix_space)"),
    (lambda c: c["model"].update(dropout=0.1), "its BPE model has dropout, so tokenization is random"),
    (lambda c: c.update(normalizer={"type": "Sequence", "normalizers": [{"type": "Mystery"}]}),
     "its normalizer 'Mystery' is not known to act on each piece alone"),
    (lambda c: c.update(truncation={"max_length": 8}),
     "tokenizer.json configures truncation or padding, which act on the whole encoding"),
])
def test_configurations_that_break_the_proof_are_named(change, reason: str) -> None:
    config = qwen_config()
    assert hf_segment_proof(config) is None
    change(config)
    assert hf_segment_proof(config) == reason
    assert not hf_segment_plan(config).proven


def test_tiktoken_proof_needs_no_special_token_to_prefix_another() -> None:
    assert tiktoken_segment_proof({"<|end|>": 1, "<|endoftext|>": 2}, None) is None
    assert tiktoken_segment_proof({"<|a|>": 1, "<|a|>b": 2}, None) == (
        "special token '<|a|>' is a prefix of '<|a|>b', so tiktoken's split is order-dependent")


def test_splitter_is_leftmost_longest() -> None:
    pattern = leftmost_longest_pattern(["<a>", "<a>b", "b<a", "<ab"])
    assert [m.group() for m in pattern.finditer("x<a>b<ab<a>")] == ["<a>b", "<ab", "<a>"]
    assert leftmost_longest_pattern([]) is None


def test_lstrip_token_breaks_naive_splitting_and_the_wrapper_falls_back() -> None:
    # The real DeepSeek tokenizer.json with its end-of-sentence token switched to lstrip=true: the token then
    # swallows the space before it, which a split at the token cannot know.
    source = load_model("deepseek-v4").tokenizer.inner.backend.to_str()
    data = json.loads(source)
    eos = next(t for t in data["added_tokens"] if t["content"] == "<｜end▁of▁sentence｜>")
    eos["lstrip"] = True
    inner = HFTokenizer(json.dumps(data), name="deepseek-v4 with lstrip")
    text = "Hello <｜end▁of▁sentence｜> world"
    whole = inner.encode(text)
    ids = {t["content"]: t["id"] for t in data["added_tokens"] if not t["normalized"]}
    naive = SegmentCachedTokenizer(inner, SegmentPlan(((leftmost_longest_pattern(ids), ids),)))
    assert naive.encode(text).ids != whole.ids
    wrapper = segment_cached_hf(inner, "deepseek-v4 with lstrip")
    assert not wrapper.plan.proven
    assert wrapper.segment_note.endswith("whole strings only, because added token '<｜end▁of▁sentence｜>' has "
                                         "lstrip=true, so its match depends on the text around it")
    assert wrapper.encode(text).ids == whole.ids and wrapper.encode(text).offsets == whole.offsets
    # Extending a text tokenizes it whole there too; only the characters are shared.
    before = wrapper.encode_extending("Hello")
    after = wrapper.encode_extending(text, before)
    assert after.ids.materialize() == whole.ids and after.chars.materialize() == text
    assert (after.chars.keep, after.ids.keep) == (len("Hello"), 0)
