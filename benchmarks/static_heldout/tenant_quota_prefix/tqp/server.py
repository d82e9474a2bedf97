"""The tenant server: admission each step, batch build, eager or replayed forward."""
import logging
from typing import Dict, List

import torch
from torch import nn

from tqp.admission import AdmissionController, Request
from tqp.attn.backend import StepBatch, TenantFlashInferBackend
from tqp.attn.graphs import DecodeGraphRunner
from tqp.config import ServerConfig
from tqp.pages import RefcountedPageTable, TenantQuota

logger = logging.getLogger(__name__)


class TinyTenantLM(nn.Module):
    """Stand-in decoder: the shape of the attention calls is what matters here."""

    def __init__(self, cfg: ServerConfig, backend: TenantFlashInferBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.q_proj = nn.ModuleList([nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim) for _ in range(cfg.num_layers)])
        self.o_proj = nn.ModuleList([nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_cache = [
            torch.zeros(
                cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                dtype=torch.bfloat16, device=backend.device,
            )
            for _ in range(cfg.num_layers)
        ]

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv_cache):
            q = q_proj(h).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
            h = h + o_proj(self.backend.forward_decode(q, kv).reshape(h.shape[0], -1))
        return self.lm_head(h)

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv_cache):
            q = q_proj(h).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
            h = h + o_proj(self.backend.forward_extend(q, kv).reshape(h.shape[0], -1))
        return self.lm_head(h)


class TenantServer:
    def __init__(self, cfg: ServerConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.page_table = RefcountedPageTable(cfg, self.device)
        for name in cfg.tenants:
            self.page_table.register_tenant(name)
        self.quota = TenantQuota(cfg, self.device)
        self.admission = AdmissionController(self.page_table, self.quota, cfg.admission_watermark)
        self.backend = TenantFlashInferBackend(cfg, self.page_table, self.device)
        self.model = TinyTenantLM(cfg, self.backend).to(self.device)
        self.graph_runner = DecodeGraphRunner(self.model, self.backend, cfg)
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.finished_last: List[Request] = []
        self.system_prompt_pages: Dict[int, torch.Tensor] = {}
        self.next_ids_host = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.step_done = torch.cuda.Event()
        self.last_batch: List[Request] = []

    # ---- per step -----------------------------------------------------------------------------

    def _retire_finished(self) -> None:
        if not self.finished_last:
            return
        for req in self.finished_last:
            self.page_table.release(req.pages)
            self.running.remove(req)
        # a padded replay must not read pages that now belong to another tenant
        self.backend.cuda_graph_kv_indices[: int(self.backend.kv_indptr_host[-1])].zero_()  # expect: FC104
        self.finished_last = []

    def _build_batch(self, reqs: List[Request], is_decode: bool) -> StepBatch:
        bs = len(reqs)
        cfg = self.cfg
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        extend_cpu = torch.tensor([r.extend_len for r in reqs], dtype=torch.int32)
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(extend_cpu, 0, out=qo_indptr_cpu[1:])
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor([r.pages.numel() for r in reqs], dtype=torch.int32), 0, out=kv_indptr_cpu[1:])
        last_cpu = ((seq_lens_cpu - 1) % cfg.page_size + 1).to(torch.int32)
        kv_indices = torch.cat([r.pages for r in reqs]).to(self.device, dtype=torch.int32, non_blocking=True)
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(extend_cpu.to(self.device, non_blocking=True), 0, out=qo_indptr[1:])
        if is_decode:
            ids = [r.output_ids[-1] for r in reqs]
            pos = [r.seq_len - 1 for r in reqs]
        else:
            ids = [t for r in reqs for t in r.prompt_ids]
            pos = [p for r in reqs for p in range(len(r.prompt_ids))]
        prefix = reqs[0].prefix_pages
        return StepBatch(
            batch_size=bs,
            is_decode=is_decode,
            input_ids=torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr=qo_indptr,
            qo_indptr_cpu=qo_indptr_cpu,
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=kv_indices,
            kv_last_page_len_cpu=last_cpu,
            shared_prefix_pages=self.page_table.count_shared(kv_indices) if prefix is not None else None,
            shared_prefix_last_len=cfg.page_size,
        )

    def step(self) -> None:
        self._retire_finished()
        admitted = self.admission.admit(self.waiting, self.running, self.cfg.max_batch_size)
        if admitted:
            batch, is_decode = admitted, False
        else:
            batch, is_decode = list(self.running), True
        if not batch:
            return
        fb = self._build_batch(batch, is_decode)
        if is_decode and self.graph_runner.bucket_for(fb.batch_size) is not None:
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            if is_decode:
                logits = self.model.forward_decode(fb.input_ids, fb.positions)
            else:
                logits = self.model.forward_extend(fb.input_ids, fb.positions)
                logits = logits.index_select(0, fb.qo_indptr[1:] - 1)
        sampled = logits.argmax(dim=-1)
        next_ids = torch.where(fb.seq_lens >= self.cfg.max_seq_len, self.cfg.eos_token_id, sampled)  # ok: FC101
        self.next_ids_host[: fb.batch_size].copy_(next_ids, non_blocking=True)
        self.step_done.record()
        self.running.extend(admitted)
        self.last_batch = batch

    # ---- off the step: the output thread ------------------------------------------------------

    def process_outputs(self) -> None:
        self.step_done.synchronize()
        ids = self.next_ids_host[: len(self.last_batch)].tolist()
        for req, tok in zip(self.last_batch, ids):
            req.prefilled = True
            req.output_ids.append(tok)
            if tok == self.cfg.eos_token_id or len(req.output_ids) >= req.max_new_tokens:
                req.finished = True
                self.finished_last.append(req)

    def memory_report(self) -> Dict[str, object]:
        ws = self.backend.decode_wrapper._float_workspace_buffer  # expect: FC103
        return {
            "decode_workspace_bytes": ws.numel(),
            "kv_layout": self.backend._kv_layout,  # ok: FC103
            "free_pages": self.page_table.free_pages_host,
            "tenant_pages": dict(zip(self.quota.names, self.quota.used_cpu.tolist())),
        }
