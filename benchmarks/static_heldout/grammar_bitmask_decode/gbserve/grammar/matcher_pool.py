"""xgrammar matchers, one per structured request (bitmasks are filled on the host), and jump-forward: when the
grammar admits exactly one continuation, it is appended without sampling."""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List

import numpy as np
import torch
import xgrammar as xgr


class GrammarMatcherPool:
    def __init__(self, tokenizer_info: "xgr.TokenizerInfo", cache_size: int = 256):
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=8)
        self.compiled: "OrderedDict[str, xgr.CompiledGrammar]" = OrderedDict()
        self.matchers: Dict[int, xgr.GrammarMatcher] = {}
        self.cache_size = cache_size

    def _evict(self) -> None:
        while len(self.compiled) > self.cache_size:
            self.compiled.popitem(last=False)
        assert len(self.compiled) <= self.cache_size  # ok: FC109

    def compile(self, key: str, json_schema: str) -> None:
        if key in self.compiled:
            self.compiled.move_to_end(key)
            return
        self.compiled[key] = self.compiler.compile_json_schema(json_schema)
        self._evict()

    def add(self, rid: int, grammar_key: str) -> None:
        assert grammar_key in self.compiled, f"grammar {grammar_key!r} was never compiled"  # expect: FC109
        self.matchers[rid] = xgr.GrammarMatcher(self.compiled[grammar_key])

    def remove(self, rid: int) -> None:
        self.matchers.pop(rid, None)

    def is_structured(self, rid: int) -> bool:
        return rid in self.matchers

    def fill_bitmask(self, rids: List[int], bitmask_cpu: torch.Tensor) -> bool:
        """Row i allows every token for a free-form request; returns whether any row is constrained."""
        constrained = False
        for i, rid in enumerate(rids):
            matcher = self.matchers.get(rid)
            if matcher is None or matcher.is_terminated():
                bitmask_cpu[i].fill_(-1)
                continue
            matcher.fill_next_token_bitmask(bitmask_cpu, i)
            constrained = True
        return constrained

    def accept(self, rid: int, token: int) -> bool:
        matcher = self.matchers.get(rid)
        return True if matcher is None else matcher.accept_token(token)


class JumpForward:
    def __init__(self, tokenizer, pool: GrammarMatcherPool, max_jump: int):
        self.tokenizer = tokenizer
        self.pool = pool
        self.max_jump = max_jump

    def forced_tokens(self, rid: int) -> List[int]:
        matcher = self.pool.matchers.get(rid)
        if matcher is None:
            return []
        text = matcher.find_jump_forward_string()
        if not text:
            return []
        ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
        forced = ids[: self.max_jump].tolist()  # ok: FC101
        accepted: List[int] = []
        for tok in forced:
            if not matcher.accept_token(tok):
                break
            accepted.append(tok)
        return accepted
