"""FlashInfer attention for fork/join batches.

Eager steps run a two-level cascade (the conversation prefix once per conversation, then each
branch's own pages) so that a 16-way fan-out reads the shared prefix once. Decode steps that fit a
bucket replay a captured graph over whole page lists instead.
"""

import functools
import logging
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from agentkv.config import CASCADE_LEVELS, CASCADE_WORKSPACE_BYTES, AgentServeConfig
from agentkv.cow_pages import CowPagePool
from agent_rt.metadata import BranchMetadata

logger = logging.getLogger(__name__)

_LEVELS_ATTR = "_num_levels"


class CascadeAgentBackend:
    def __init__(self, cfg: AgentServeConfig, pool: CowPagePool, device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self._kv_layout = "NHD"
        self.sm_scale = cfg.head_dim**-0.5
        self.cascade_workspace = torch.zeros(CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.cascade = MultiLevelCascadeAttentionWrapper(CASCADE_LEVELS, self.cascade_workspace, self._kv_layout)
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, use_tensor_cores=True, backend="fa2"
        )
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self._plan_tail = functools.partial(
            self.decode_eager.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )

        max_bs = cfg.max_graph_bs
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_branch, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.static_write_pages = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_write_offsets = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace: Optional[torch.Tensor] = None
        self.branch_out = None
        self.forward_md: Optional[BranchMetadata] = None

    # ------------------------------------------------------------------ set-up
    def init_graph_wrappers(self) -> None:
        self.graph_workspace = torch.zeros(self.cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )

    def describe(self) -> str:
        layout = self._kv_layout  # ok: FC103
        return f"cascade({CASCADE_LEVELS} levels) + {len(self.graph_wrappers)} decode graphs, {layout}"

    def check_cascade_depth(self) -> None:
        levels = getattr(self.cascade, _LEVELS_ATTR)  # expect: FC103
        if levels != CASCADE_LEVELS:
            raise RuntimeError(f"cascade wrapper has {levels} levels, the engine plans {CASCADE_LEVELS}")

    def graph_memory_report(self) -> Dict[int, int]:
        report = {}
        for bs, w in self.graph_wrappers.items():
            report[bs] = w._int_workspace_buffer.numel()  # expect: FC103
        return report

    # ------------------------------------------------------------------ eager steps
    def init_forward_metadata(self, md: BranchMetadata) -> None:
        self.forward_md = md
        if self.branch_out is None:
            self.branch_out = torch.zeros(  # ok: FC107
                self.cfg.max_step_tokens, self.cfg.num_qo_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=self.device
            )
        if md.cow_rows_np.size:
            self.pool.resolve_writes(md.write_pages)
        if md.use_trtllm:
            return
        if md.is_extend:
            self._plan_extend(md)
        elif md.has_shared_prefix:
            self._plan_cascade(md)
        else:
            self._plan_tail(md.kv_indptr, md.kv_indices, md.last_page_len_cpu)  # expect: FC102

    def _plan_cascade(self, md: BranchMetadata) -> None:
        shared = md.shared
        self.cascade.plan(  # expect: FC102
            [shared.qo_indptr_cpu, md.branch_qo_indptr],
            [shared.kv_indptr_cpu, md.branch_kv_indptr_cpu],
            [shared.kv_indices, md.branch_kv_indices],
            [shared.last_page_len_cpu, md.last_page_len_cpu],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )

    def _plan_extend(self, md: BranchMetadata) -> None:
        """Tool results appended to several branches at once: a multi-token cascade prefill."""
        shared = md.shared
        self.cascade.plan(  # ok: FC102
            [shared.qo_indptr_cpu, md.branch_qo_indptr_cpu],
            [shared.kv_indptr_cpu, md.branch_kv_indptr_cpu],
            [shared.kv_indices, md.branch_kv_indices],
            [shared.last_page_len_cpu, md.last_page_len_cpu],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )

    def block_tables(self, md: BranchMetadata) -> torch.Tensor:
        """[bs, max_pages] page table for trtllm-gen, gathered on the device from the page lists."""
        nnz = md.kv_indices.numel()
        cols = torch.arange(self.cfg.max_pages_per_branch, dtype=torch.int32, device=self.device)
        idx = (md.kv_indptr[:-1, None] + cols[None, :]).clamp_(max=nnz - 1)
        return md.kv_indices[idx.long()]

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, md: BranchMetadata) -> None:
        self.forward_md = md
        self.graph_indptr_cpu[: bs + 1].copy_(md.kv_indptr_cpu)
        self.graph_last_page_len_cpu[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.graph_indptr_cpu[: bs + 1],
            self.graph_kv_indices,
            self.graph_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )
        if md.has_shared_prefix:
            self._plan_cascade(md)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, md: BranchMetadata) -> None:
        n = md.batch_size
        self.forward_md = md
        nnz = int(md.kv_indptr_cpu[n])
        self.graph_indptr_cpu[: n + 1].copy_(md.kv_indptr_cpu[: n + 1])
        self.graph_indptr_cpu[n + 1 : bs + 1] = nnz
        self.graph_last_page_len_cpu[:n].copy_(md.last_page_len_cpu[:n])
        self.graph_kv_indices[:nnz].copy_(md.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.static_write_pages[:n].copy_(md.write_pages[:n], non_blocking=True)
        self.static_write_offsets[:n].copy_(md.write_offsets[:n], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.graph_indptr_cpu[: bs + 1],
            self.graph_kv_indices,
            self.graph_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )
        # padding rows: the pinned mirror keeps a one-token last page for the next plan
        self.graph_last_page_len_cpu[n:bs] = 1  # ok: FC104
        # padding rows read no pages
        self.graph_kv_indptr[n + 1 : bs + 1] = nnz  # expect: FC104

    # ------------------------------------------------------------------ forward
    def store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        md = self.forward_md
        cache = self.pool.kv_cache[layer_id]
        if md.graph_bs is not None:
            pages, offsets = self.static_write_pages[: k.shape[0]], self.static_write_offsets[: k.shape[0]]
        else:
            pages, offsets = md.write_pages, md.write_offsets
        cache[pages, 0, offsets] = k
        cache[pages, 1, offsets] = v

    def decode_attention(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_md
        kv = self.pool.kv_cache[layer_id]
        if md.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv,
                self.trtllm_workspace,
                self.block_tables(md),
                md.seq_lens,
                md.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
                out=self.branch_out[: q.shape[0]],
            )
        if md.has_shared_prefix:
            return self.cascade.run(q, kv)  # expect: FC108
        w = self.decode_eager if md.graph_bs is None else self.graph_wrappers[md.graph_bs]
        return w.run(q, kv)  # ok: FC108
