"""MTP speculative-decoding worker: verify, accept, draft-extend, then draft the next round."""
from __future__ import annotations

import logging
from typing import List, Optional

import torch

from dsv3_mtp.graph_runner import MTPGraphRunner
from dsv3_mtp.mla_backend import FlashInferMLABackend
from dsv3_mtp.models import DeepseekV3ForCausalLM, DeepseekV3MTP
from dsv3_mtp.spec import AcceptStats, DeepseekV3Config, RoundResult, SpecBatch, SpecLimits

logger = logging.getLogger(__name__)


class MTPWorker:
    def __init__(self, cfg: DeepseekV3Config, limits: SpecLimits, device: torch.device):
        assert cfg.num_nextn_predict_layers == 1, "DeepSeek-V3 ships exactly one MTP layer"  # expect: FC109
        self.cfg = cfg
        self.limits = limits
        self.device = device
        self.k = limits.tokens_per_req
        self.num_draft_steps = limits.num_draft_steps
        self.req_to_page = torch.zeros(
            limits.max_running_requests + 1, limits.max_pages_per_req, dtype=torch.int32, device=device
        )
        self.attn_backend = FlashInferMLABackend(cfg, limits, self.req_to_page, device)
        self.target_model = DeepseekV3ForCausalLM(cfg).to(device)
        self.draft_model = DeepseekV3MTP(cfg, self.target_model.embed_tokens, self.target_model.lm_head).to(device)
        self.stats = AcceptStats(self.num_draft_steps)
        self.step_offsets = torch.arange(self.k, device=device)
        self.accept_length_buf: Optional[torch.Tensor] = None
        self.out_pinned = torch.zeros(limits.max_running_requests * self.k, dtype=torch.int64, pin_memory=True)
        self.out_ready = torch.cuda.Event()
        int_ws = self.attn_backend.eager_wrapper._int_workspace_buffer  # expect: FC103
        logger.info("MLA planner int workspace: %d bytes", int_ws.numel())
        self.graph_runner: Optional[MTPGraphRunner] = None
        if limits.cuda_graph_bs:
            self.graph_runner = MTPGraphRunner(self)

    def _verify(self, batch: SpecBatch):
        if self.graph_runner is not None and self.graph_runner.can_run(batch.batch_size):
            return self.graph_runner.replay_verify(batch)
        self.attn_backend.init_forward_metadata(batch)
        return self.target_model(batch.draft_tokens.flatten(), batch.positions, self.attn_backend)

    def forward_batch_speculative(self, batch: SpecBatch) -> RoundResult:
        bs, k = batch.batch_size, self.k
        logits, hidden = self._verify(batch)
        target_ids = torch.argmax(logits, dim=-1).view(bs, k)
        matches = (batch.draft_tokens[:, 1:] == target_ids[:, :-1]).int()
        accept_length = torch.cumprod(matches, dim=1).sum(dim=1) + 1
        if self.accept_length_buf is None:
            self.accept_length_buf = torch.zeros(self.limits.max_running_requests, dtype=torch.int32, device=self.device)  # ok: FC107
        self.accept_length_buf[:bs].copy_(accept_length)  # ok: FC104
        accept_mask = self.step_offsets[None, :] < accept_length[:, None]
        padded_ids = target_ids.masked_fill(~accept_mask, -1)  # ok: FC101
        self.out_pinned[: bs * k].copy_(padded_ids.flatten(), non_blocking=True)
        self.out_ready.record()

        # draft extend: the MTP layer re-reads every accepted token (ragged, 1..k per request)
        accepted_ids = target_ids[accept_mask]  # expect: FC101
        accept_length_cpu = self.accept_length_buf[:bs].tolist()  # expect: FC101
        self.stats.update(accept_length_cpu)
        accept_length_host = torch.tensor(accept_length_cpu, dtype=torch.int32)
        rows_host = torch.cat([torch.arange(i * k, i * k + n) for i, n in enumerate(accept_length_cpu)])
        rows = rows_host.to(self.device, non_blocking=True)
        ext_positions = batch.positions[rows]
        ext_hidden = hidden[rows]
        self.attn_backend.plan_draft_extend(bs, accept_length_host, batch.seq_lens_cpu, batch.req_pool_indices, batch.out_cache_loc[rows])
        if self.graph_runner is not None and self.graph_runner.can_run(bs):
            d_logits, d_hidden = self.graph_runner.replay_draft_extend(bs, accepted_ids, ext_positions, ext_hidden)
        else:
            d_logits, d_hidden = self.draft_model(accepted_ids, ext_positions, ext_hidden, self.attn_backend)
        last = torch.cumsum(accept_length, dim=0) - 1
        draft = [torch.argmax(d_logits[last], dim=-1)]
        last_hidden = d_hidden[last]

        new_seq_lens_cpu = batch.seq_lens_cpu + accept_length_host
        next_positions = batch.positions.view(bs, k)[:, 0] + accept_length
        if self.graph_runner is not None and self.graph_runner.can_run(bs):
            draft_in = None
            for step in range(1, self.num_draft_steps):
                if draft_in is None:
                    draft_in, s_logits, last_hidden = self.graph_runner.replay_draft(
                        bs, batch.req_pool_indices, new_seq_lens_cpu, draft[-1], last_hidden, next_positions, batch.out_cache_loc[:bs]
                    )
                else:
                    # same plan for the following steps: one more token per request
                    draft_in.kv_lens.add_(1)  # expect: FC104
                    draft_in.positions.add_(1)
                    s_logits, last_hidden = self.graph_runner.replay_draft_again(bs, draft[-1], last_hidden)
                draft.append(torch.argmax(s_logits, dim=-1))
        return RoundResult(
            new_seq_lens=new_seq_lens_cpu.tolist(),  # ok: FC101
            next_draft_tokens=torch.stack(draft, dim=1),
            output_ids_ready=self.out_ready,
        )

    def acceptance_report(self) -> List[float]:
        return [self.stats.mean_accept_length()] + (self.stats.hist / max(1, self.stats.hist.sum())).tolist()
