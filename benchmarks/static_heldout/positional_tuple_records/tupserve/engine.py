"""Offline front end: add requests, run steps until every request is done."""

from __future__ import annotations

import itertools
from collections import defaultdict

from .config import EngineConfig
from .model_runner import ModelRunner


class LLMEngine:
    def __init__(self, cfg: EngineConfig):
        self.outputs: dict[int, list[int]] = defaultdict(list)
        self.runner = ModelRunner(cfg, token_sink=self._on_token)
        self.runner.warmup()
        self._rids = itertools.count()

    def _on_token(self, rid: int, tok: int) -> None:
        self.outputs[rid].append(tok)

    def set_system_prompt(self, page_ids: list[int], last_page_len: int) -> None:
        self.runner.attn_backend.set_shared_prefix(page_ids, last_page_len)

    def add_request(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_new_tokens: int = 0,
    ) -> int:
        rid = next(self._rids)
        params = (temperature, top_p, top_k, min_new_tokens)
        self.runner.scheduler.add_request(rid, prompt_ids, params, max_new_tokens)
        return rid

    def run(self) -> dict[int, list[int]]:
        while self.runner.scheduler.has_work():
            self.runner.step()
        self.runner.shutdown()
        return dict(self.outputs)
