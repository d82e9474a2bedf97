"""Engine loop: eager prefill, graph-replayed absorbed MLA decode."""

from typing import List, Optional, Tuple

import numpy as np
import torch

from mlaserve import CompressedKVPool, MLAConfig
from mla_run.attention import MLAAttention
from mla_run.metadata import MLAPrefillMeta, make_decode_meta
from mla_run.model import MLAModel
from mla_run.runner import MLADecodeRunner


class MLAEngine:
    def __init__(self, cfg: MLAConfig, device: torch.device, eos_id: int = 1):
        self.cfg = cfg
        self.device = device
        self.eos_id = eos_id
        self.pool = CompressedKVPool(cfg, device)
        self.attn = MLAAttention(cfg, device)
        self.attn.bind_pool(self.pool.ckv, self.pool.kpe)
        self.model = MLAModel(cfg, self.attn, self.pool).to(device)
        self.runner = MLADecodeRunner(self.model, self.attn, cfg, device)
        self._sampled: Optional[torch.Tensor] = None

    def warmup(self) -> None:
        metas = {}
        for bs in self.cfg.graph_buckets:
            metas[bs] = make_decode_meta([[0]] * bs, [1] * bs, self.cfg, self.device)
        self.runner.record_graphs(metas)

    def prefill_step(self, ids: torch.Tensor, prompt_lens: List[int]) -> torch.Tensor:
        cu = np.zeros(len(prompt_lens) + 1, dtype=np.int32)
        np.cumsum(prompt_lens, out=cu[1:])
        meta = MLAPrefillMeta(
            num_tokens=int(cu[-1]),
            cu_seqlens_cpu=torch.from_numpy(cu),
            cu_seqlens_kv_cpu=torch.from_numpy(cu.copy()),
            positions=torch.cat([torch.arange(n) for n in prompt_lens]).to(self.device, non_blocking=True),
        )
        self.attn.plan_prefill(meta)
        return self.model.prefill(ids[: meta.num_tokens])

    def decode_step(self, page_lists: List[List[int]], seq_lens: List[int],
                    ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        meta = make_decode_meta(page_lists, seq_lens, self.cfg, self.device)
        n = meta.batch_size
        bs = self.runner.bucket(n)
        if bs is None:
            self.attn.plan_eager(meta)
            logits = self.model.decode(ids, meta, n)
        elif self.runner.prepare_replay(bs, meta, ids):
            logits = self.model.decode_trtllm(ids, meta)
        else:
            logits = self.runner.replay(bs, n)
            # advance the bound lengths in place so that the next replay need not re-plan
            lens = self.attn.kv_len_arr
            lens[:n] += 1  # expect: FC104
        next_tokens = logits.argmax(-1)
        finished = (next_tokens == self.eos_id) | (meta.kv_lens + 1 >= self.cfg.max_context_len)
        done_rows = finished.nonzero(as_tuple=True)[0]  # expect: FC101
        next_tokens = torch.where(finished, torch.full_like(next_tokens, self.eos_id), next_tokens)  # ok: FC101
        if self._sampled is None:
            self._sampled = torch.empty(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
        self._sampled[:n].copy_(next_tokens)
        return self._sampled[:n], done_rows
