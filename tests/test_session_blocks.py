"""Block-granular and hybrid accounting: a hand-worked example, then the handbook's real session.

The hand-worked example feeds `reuse_of` plain id sequences (integers standing for tokens: the accounting compares
ids and nothing else), so every figure below can be checked with pencil and paper.
"""

from __future__ import annotations

import pytest

from engine.errors import ExplorerError
from engine.models import load_model
from engine.session import (
    CachedSequence,
    Reuse,
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
