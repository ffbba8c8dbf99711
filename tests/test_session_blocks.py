"""Block-granular and hybrid accounting: a hand-worked example, then the handbook's real session.

The hand-worked example feeds `reuse_of` plain id sequences (integers standing for tokens: the accounting compares
ids and nothing else), so every figure below can be checked with pencil and paper.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.errors import ExplorerError
from engine.models import load_model
from engine.prefix import JoinedText, SharedSequence, common_prefix, common_prefix_from_end, shared_common_prefix
from engine.session import (
    CHECKPOINT_POLICIES,
    CachedSequence,
    Reuse,
    ReuseIndex,
    block_reusable,
    checkpoints_after,
    load_session,
    reuse_of,
    simulate_session,
)

# Four requests of a made-up session (ids are plain integers):
#   request 1: prompt p1 = 0..36 (37 tokens), decodes 37..49 -> sequence s1 = 0..49 (50 tokens)
#   request 2: prompt p2 = s1 + 100..119 (70 tokens), decodes 200..210 -> s2 (81 tokens)
#   request 3: the client rewrote history at token 45: p3 = 0..44 + 300..329 (75 tokens), decodes 400..404 -> s3 (80)
#   request 4: p4 = s3[:60] + 500..509 (70 tokens)
# Checkpoint policy prompt-and-generation-end: s1 keeps state at (37, 50), s2 at (70, 81), s3 at (75, 80).
S1 = tuple(range(50))
P2 = S1 + tuple(range(100, 120))
S2 = P2 + tuple(range(200, 211))
P3 = tuple(range(45)) + tuple(range(300, 330))
S3 = P3 + tuple(range(400, 405))
P4 = S3[:60] + tuple(range(500, 510))
CACHE1 = CachedSequence(S1, checkpoints_after(37, 50, "prompt-and-generation-end"))
CACHE2 = CachedSequence(S2, checkpoints_after(70, 81, "prompt-and-generation-end"))
CACHE3 = CachedSequence(S3, checkpoints_after(75, 80, "prompt-and-generation-end"))


def test_hand_worked_example_inputs() -> None:
    assert (len(P2), len(S2), len(P3), len(S3), len(P4)) == (70, 81, 75, 80, 70)
    assert (CACHE1.checkpoints, CACHE2.checkpoints, CACHE3.checkpoints) == ((37, 50), (70, 81), (75, 80))


@pytest.mark.parametrize(
    ("block_size", "block_reusable_per_request", "block_prefill_total"),
    [
        # common prefixes (worked below): request 2 50, request 3 45, request 4 60
        # block 16: 50//16=3 -> 48; 45//16=2 -> 32; 60//16=3 -> 48. Prefill 37 + (70-48) + (75-32) + (70-48)
        #           = 37 + 22 + 43 + 22 = 124
        (16, (0, 48, 32, 48), 124),
        # block 4:  50//4=12 -> 48; 45//4=11 -> 44; 60//4=15 -> 60. Prefill 37 + 22 + 31 + 10 = 100
        (4, (0, 48, 44, 60), 100),
        # block 1 (token-level radix): 50, 45, 60. Prefill 37 + 20 + 30 + 10 = 97
        (1, (0, 50, 45, 60), 97),
    ],
)
def test_hand_worked_block_reuse(block_size: int, block_reusable_per_request: tuple[int, ...],
                                 block_prefill_total: int) -> None:
    # Request 1: nothing cached.
    r1 = reuse_of(tuple(range(37)), [], block_size)
    # Request 2: p2 starts with all of s1 -> common 50. Hybrid: s1's checkpoints 37 and 50 are both <= 50, take 50.
    r2 = reuse_of(P2, [CACHE1], block_size)
    # Request 3: p3 agrees with s1 and with s2 through token 44 -> common 45 (the tie goes to the later s2).
    #   Hybrid: s1 agrees through 45, so its checkpoint 37 is valid (50 is not); s2's 70 and 81 are past 45 -> 37.
    r3 = reuse_of(P3, [CACHE1, CACHE2], block_size)
    # Request 4: common with s1 45, with s2 45, with s3 60 -> 60, from s3.
    #   Hybrid: s1's 50 is <= 60 but s1 differs from p4 from token 45 on, so only its 37 counts; s2's 70/81 and
    #   s3's 75/80 are past their common prefixes -> 37. (Counting every checkpoint <= 60 would wrongly give 50.)
    r4 = reuse_of(P4, [CACHE1, CACHE2, CACHE3], block_size)
    reuses = (r1, r2, r3, r4)
    assert tuple(r.token for r in reuses) == (0, 50, 45, 60)
    assert tuple(r.matched for r in reuses) == (-1, 0, 1, 2)
    assert tuple(r.hybrid for r in reuses) == (0, 50, 37, 37)
    assert tuple(r.block for r in reuses) == block_reusable_per_request
    prompts = (37, 70, 75, 70)
    assert sum(p - r.block for p, r in zip(prompts, reuses)) == block_prefill_total
    # Hybrid prefill: 37 + (70-50) + (75-37) + (70-37) = 37 + 20 + 38 + 33 = 128
    assert sum(p - r.hybrid for p, r in zip(prompts, reuses)) == 128


def test_block_reusable_counts_whole_blocks_only() -> None:
    # 47 tokens in common: two whole 16-blocks (32), eleven 4-blocks (44), every token at block size 1.
    assert (block_reusable(47, 16), block_reusable(47, 4), block_reusable(47, 1)) == (32, 44, 47)
    assert block_reusable(15, 16) == 0 and block_reusable(16, 16) == 16


def test_checkpoint_policies() -> None:
    assert checkpoints_after(506, 580, "prompt-and-generation-end") == (506, 580)
    assert checkpoints_after(506, 580, "generation-end") == (580,)
    assert checkpoints_after(506, 580, "none") == ()
    assert reuse_of(P2, [CachedSequence(S1, ())], 16) == Reuse(token=50, block=48, hybrid=0, matched=0)
    with pytest.raises(ExplorerError, match="unknown checkpoint policy 'sometimes'"):
        checkpoints_after(1, 2, "sometimes")


# The handbook's session (Qwen3.5-0.8B template and tokenizer). Token-level reuse is 0, 580, 880, 504.
#   block 16: 580 = 36*16 + 4 -> 576; 880 = 55*16 -> 880; 504 = 31*16 + 8 -> 496.
#             prefill 506 + (773-576) + (898-880) + (824-496) = 506 + 197 + 18 + 328 = 1049
#   block 4:  580, 880 and 504 are multiples of 4 -> same as token level, prefill 1037
#   block 1:  token level, prefill 1037
@pytest.mark.parametrize(
    ("block_size", "block_reusable_per_request", "block_prefill_total"),
    [(16, [0, 576, 880, 496], 1049), (4, [0, 580, 880, 504], 1037), (1, [0, 580, 880, 504], 1037)],
)
def test_handbook_session_block_figures(block_size: int, block_reusable_per_request: list[int],
                                        block_prefill_total: int) -> None:
    report = simulate_session(load_model("qwen3.5"), load_session("handbook"), block_size=block_size)
    assert [r.block_reusable_tokens for r in report.rows] == block_reusable_per_request
    assert report.total_block_prefill_tokens == block_prefill_total
    assert report.totals("block").prefill_tokens == block_prefill_total
    assert [r.reusable_tokens for r in report.rows] == [0, 580, 880, 504]


def test_handbook_session_hybrid_policies() -> None:
    model, script = load_model("qwen3.5"), load_session("handbook")
    # prompt-and-generation-end: checkpoints 506, 580, 773, 880, 898, 945; request 4's 504 is before all -> 0.
    default = simulate_session(model, script)
    assert [r.hybrid_reusable_tokens for r in default.rows] == [0, 580, 880, 0]
    # generation-end: request 2 resumes at 580 and request 3 at 880 (both sequence ends) -> same figures.
    gen_end = simulate_session(model, script, checkpoint_policy="generation-end")
    assert [r.hybrid_reusable_tokens for r in gen_end.rows] == [0, 580, 880, 0]
    # none: every request prefills its whole prompt, 3001 tokens.
    none = simulate_session(model, script, checkpoint_policy="none")
    assert none.total_hybrid_prefill_tokens == 3001
    with pytest.raises(ExplorerError, match="block size must be at least 1, got 0"):
        simulate_session(model, script, block_size=0)


# The incremental index the simulator uses gives `reuse_of`'s figures, on the hand-worked example and on random
# sessions whose prompts extend, rewrite, cut and repeat earlier sequences (ties between sequences included).


def _shared(ids: tuple[int, ...], parent: SharedSequence | None = None, keep: int = 0) -> SharedSequence:
    return SharedSequence(parent, keep, np.asarray(ids[keep:] if parent is not None else ids, dtype=np.int32))


def _index_figures(requests: list[tuple[tuple[int, ...] | None, tuple[int, ...], tuple[int, ...]]],
                   block_size: int) -> tuple[list[Reuse], list[Reuse], list[Reuse]]:
    """(prompt, sequence, checkpoints) per request -> reuse_of's figures for each prompt, and ReuseIndex's fed
    shared sequences as the session stores them, and fed the plain tuples."""
    index, plain_index, cached, expected, got, got_plain = ReuseIndex(block_size), ReuseIndex(block_size), [], [], \
        [], []
    previous: SharedSequence | None = None
    for prompt, sequence, checkpoints in requests:
        if prompt is None:  # a sequence cached with no prompt measured before it
            index.add(sequence, checkpoints)
            plain_index.add(sequence, checkpoints)
            cached.append(CachedSequence(sequence, checkpoints))
            continue
        expected.append(reuse_of(prompt, cached, block_size))
        # Store each the way the session does: sharing its start with the sequence before where they agree.
        agree = common_prefix(prompt, previous.materialize()) if previous is not None else 0
        prompt_ids = _shared(prompt, previous, agree)
        sequence_ids = _shared(sequence, prompt_ids, common_prefix(sequence, prompt))
        got.append(index.reuse(prompt_ids))
        index.add(sequence_ids, checkpoints)
        got_plain.append(plain_index.reuse(prompt))
        plain_index.add(sequence, checkpoints)
        cached.append(CachedSequence(sequence, checkpoints))
        previous = sequence_ids
    return expected, got, got_plain


def test_reuse_index_hand_worked_example() -> None:
    requests = [(tuple(range(37)), S1, CACHE1.checkpoints), (P2, S2, CACHE2.checkpoints),
                (P3, S3, CACHE3.checkpoints), (P4, P4, ())]
    for block_size in (1, 4, 16):
        expected, got, got_plain = _index_figures(requests, block_size)
        assert got == expected == got_plain
    assert [r.token for r in got] == [0, 50, 45, 60]


@pytest.mark.parametrize("seed", range(40))
def test_reuse_index_equals_reuse_of_on_random_sessions(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 50])  # few symbols: many equal prefixes, many ties
    sequences: list[tuple[int, ...]] = []
    requests = []
    for _ in range(rng.randint(1, 25)):
        base = rng.choice(sequences) if sequences and rng.random() < 0.8 else ()
        cut = rng.randint(0, len(base))
        prompt = base[:cut] + tuple(rng.randrange(alphabet) for _ in range(rng.randint(0, 300)))
        sequence = prompt[:rng.randint(len(prompt) - 3, len(prompt))] if prompt and rng.random() < 0.2 else prompt
        sequence = sequence + tuple(rng.randrange(alphabet) for _ in range(rng.randint(0, 40)))
        policy = rng.choice(CHECKPOINT_POLICIES)
        requests.append((prompt, sequence, checkpoints_after(len(prompt), len(sequence), policy)))
        sequences.append(sequence)
    if rng.random() < 0.3 and sequences:
        requests.insert(rng.randrange(len(requests) + 1), (None, rng.choice(sequences)[:rng.randint(0, 30)], ()))
    expected, got, got_plain = _index_figures(requests, rng.choice([1, 2, 16]))
    assert got == expected == got_plain


@pytest.mark.parametrize("seed", range(20))
def test_shared_sequences_slice_and_compare_like_tuples(seed: int) -> None:
    rng = random.Random(seed)
    plain: list[tuple[int, ...]] = [tuple(rng.randrange(3) for _ in range(rng.randint(0, 50)))]
    shared = [_shared(plain[0])]
    for _ in range(60):  # a chain deeper than its items, each keeping part of a random earlier one
        j = rng.randrange(len(plain))
        keep = rng.randint(0, len(plain[j]))
        tail = tuple(rng.randrange(3) for _ in range(rng.randint(0, 20)))
        plain.append(plain[j][:keep] + tail)
        shared.append(SharedSequence(shared[j], keep, np.asarray(tail, dtype=np.int32)))
    for x, y in ((rng.randrange(len(plain)), rng.randrange(len(plain))) for _ in range(200)):
        start, stop = sorted((rng.randint(0, 90), rng.randint(0, 90)))
        assert tuple(shared[x].slice(start, stop).tolist()) == plain[x][start:stop]
        assert shared[x].materialize() == plain[x] and len(shared[x]) == len(plain[x])
        assert shared_common_prefix(shared[x], shared[y]) == common_prefix(plain[x], plain[y])
        text_x, text_y = "".join(map(str, plain[x])), "".join(map(str, plain[y]))
        lcp = next((i for i, (a, b) in enumerate(zip(plain[x], plain[y])) if a != b), min(len(plain[x]),
                                                                                        len(plain[y])))
        assert common_prefix(text_x, text_y) == common_prefix(plain[x], plain[y]) == lcp
        known = rng.randint(0, lcp)  # what a caller knows agrees: only the rest is compared, the same answer
        assert common_prefix(text_x, text_y, known) == common_prefix(plain[x], plain[y], known) == lcp
        assert common_prefix_from_end(list(plain[x]), list(plain[y])) == lcp
        # A text kept as the pieces a render made it of: its tails and comparisons are the joined string's.
        cuts = sorted(rng.sample(range(len(text_x) + 1), min(len(text_x) + 1, rng.randint(0, 6))))
        pieces = [text_x[a:b] for a, b in zip([0, *cuts], [*cuts, len(text_x)])]
        joined = JoinedText(pieces, len(text_x))
        assert [joined.tail(i) for i in range(len(text_x) + 2)] == [text_x[i:] for i in range(len(text_x) + 2)]
        assert common_prefix(joined, text_y, known) == common_prefix(text_y, joined, known) == lcp
        assert str(joined) == text_x and joined.tail(known) == text_x[known:]  # joined once, then the string
