"""Matcher pool bookkeeping on the host (xgrammar only, no GPU)."""

import torch
import xgrammar as xgr

from gbserve.grammar.matcher_pool import GrammarMatcherPool


def _pool(vocab):
    info = xgr.TokenizerInfo(vocab)
    return GrammarMatcherPool(info, cache_size=2)


def test_free_form_rows_allow_everything():
    pool = _pool(["a", "b", "{", "}"])
    bitmask = torch.zeros(2, 1, dtype=torch.int32)
    assert not pool.fill_bitmask([7, 8], bitmask)  # ok: FC109
    assert bool((bitmask == -1).all())


def test_cache_evicts_oldest():
    pool = _pool(["a", "b", "{", "}"])
    for key in ("x", "y", "z"):
        pool.compile(key, '{"type": "object"}')
    assert list(pool.compiled) == ["y", "z"]
