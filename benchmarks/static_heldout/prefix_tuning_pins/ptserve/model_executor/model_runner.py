from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from ptserve.layers.flashinfer_backend import PrefixTuningAttnBackend
from ptserve.layers.model import PTModel
from ptserve.model_executor.cuda_graph_runner import CudaGraphRunner
from ptserve.model_executor.forward_batch import ForwardBatch, ForwardMode
from ptserve.server_args import ModelConfig, ServerArgs
from ptserve.tenancy.soft_prompts import SoftPromptRegistry

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_config: ModelConfig):
        self.server_args = server_args
        self.model_config = model_config
        self.device = torch.device("cuda", server_args.gpu_id)
        reserved = server_args.max_tenants * (server_args.max_virtual_tokens // server_args.page_size + 1)
        self.kv_buffers: List[torch.Tensor] = [
            torch.zeros(
                server_args.max_total_pages,
                2,
                server_args.page_size,
                model_config.num_kv_heads,
                model_config.head_dim,
                dtype=torch.bfloat16,
                device=self.device,
            )
            for _ in range(model_config.num_layers)
        ]
        self.registry = SoftPromptRegistry(
            model_config.num_layers,
            server_args.page_size,
            server_args.max_tenants,
            server_args.max_virtual_tokens,
            reserved,
            self.device,
        )
        self.attn_backend = PrefixTuningAttnBackend(self)
        self.model = PTModel(model_config).to(self.device)
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.cuda_graph_runner = CudaGraphRunner(self)

    # -- tenants -----------------------------------------------------------------------

    def add_tenant(self, tenant: str, prefix_kv: torch.Tensor) -> int:
        return self.registry.register(tenant, prefix_kv, self.kv_buffers)

    def remove_tenant(self, tenant: str) -> None:
        self.registry.evict_tenant(tenant)

    def repin_tenant(self, tenant: str, new_pages: List[int]) -> None:
        """Compact the pinned range: move a tenant's soft prompt and patch the live indices."""
        old, new = self.registry.move(tenant, new_pages)
        src = torch.tensor(old, dtype=torch.int64, device=self.device)
        dst = torch.tensor(new, dtype=torch.int64, device=self.device)
        for buf in self.kv_buffers:
            buf.index_copy_(0, dst, buf.index_select(0, src))
        remap = torch.arange(self.server_args.max_total_pages, dtype=torch.int32, device=self.device)
        remap[src] = dst.to(torch.int32)
        idx = self.attn_backend.prefix_kv_indices
        idx.copy_(remap[idx.long()])  # expect: FC104

    def workspace_report(self) -> Dict[str, int]:
        b = self.attn_backend
        report = {"prefix": b.prefix_workspace.numel(), "extend": b.extend_workspace.numel()}
        report["decode_int"] = b.decode_eager._int_workspace_buffer.numel()  # expect: FC103
        return report

    # -- steps -------------------------------------------------------------------------

    def build_batch(self, mode: ForwardMode, reqs: List[dict]) -> ForwardBatch:
        bs = len(reqs)
        page = self.server_args.page_size
        seq_lens = np.array([r["seq_len"] for r in reqs], dtype=np.int32)
        pages = [np.asarray(r["pages"], dtype=np.int32) for r in reqs]
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum([len(p) for p in pages], out=kv_indptr[1:])
        last = ((seq_lens - 1) % page + 1).astype(np.int32)
        tenants = np.array([r["tenant_slot"] for r in reqs], dtype=np.int32)
        ids = np.concatenate([np.asarray(r["input_ids"], dtype=np.int64) for r in reqs])
        pos = np.concatenate([np.asarray(r["positions"], dtype=np.int64) for r in reqs])
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(seq_lens).to(self.device, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(seq_lens),
            prefix_lens=torch.tensor([r["num_virtual"] for r in reqs], dtype=torch.int32, device=self.device),
            tenant_ids=torch.from_numpy(tenants).to(self.device, non_blocking=True),
            tenant_ids_cpu=torch.from_numpy(tenants),
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(np.concatenate(pages)).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(last),
            attn_backend=self.attn_backend,
            all_shared_prompt=all(r["tenant_slot"] == 0 for r in reqs),
        )
        if mode.is_extend():
            ext = np.array([len(r["input_ids"]) for r in reqs], dtype=np.int32)
            qo = np.zeros(bs + 1, dtype=np.int32)
            np.cumsum(ext, out=qo[1:])
            fb.extend_seq_lens = torch.from_numpy(ext).to(self.device, non_blocking=True)
            fb.extend_qo_indptr_cpu = torch.from_numpy(qo)
            fb.extend_num_tokens = int(qo[-1])
        return fb

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(fb):
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode.is_decode():
            return self.model.forward_decode(fb.input_ids, fb.positions, fb)
        return self.model.forward_extend(fb.input_ids, fb.positions, fb)
