"""FlashInfer MLA attention beside the expert-parallel MoE.

Decode: graph-mode ``BatchMLAPagedAttentionWrapper`` per captured batch size over shared index buffers, an eager
MLA wrapper for batches no graph covers, a second eager MLA wrapper for the MTP draft layer, and trtllm-gen MLA decode
for very long contexts. Extend: a ragged prefill wrapper over the new tokens.
"""

from __future__ import annotations

import logging
from typing import Dict, List

import numpy as np
import torch
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from srt_moe.config import MoEModelConfig, global_config
from srt_moe.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class FlashInferMLABackend:
    def __init__(self, cfg: MoEModelConfig, num_pages: int, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = cfg.dtype
        self.num_heads = cfg.num_heads
        self.kv_lora_rank = cfg.kv_lora_rank
        self.rope_dim = cfg.qk_rope_head_dim
        self.page_size = cfg.page_size
        self.max_bs = cfg.max_running_requests
        self.sm_scale = cfg.qk_head_dim**-0.5
        self.graph_backend = "auto"
        # one latent cache per layer plus the MTP layer: [pages, page_size, kv_lora_rank + rope]
        self.latent_cache = torch.zeros(
            cfg.num_layers + 1, num_pages, cfg.page_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
            dtype=cfg.dtype, device=device,
        )

        self.workspace_buffer = torch.zeros(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(self._prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.draft_workspace = torch.zeros(self._decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.trtllm_workspace = self._trtllm_mla_workspace()

        self.eager_decode = BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="fa2")
        self.draft_decode = BatchMLAPagedAttentionWrapper(self.draft_workspace, backend="fa2")
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.decode_wrappers: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.qo_indptr_buf = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)

    # ------------------------------------------------------------ workspaces

    def _prefill_workspace_bytes(self) -> int:
        return self.cfg.max_extend_tokens * self.num_heads * (self.cfg.v_head_dim + 1) * 4 * 2

    def _decode_workspace_bytes(self) -> int:
        return self.max_bs * self.num_heads * (self.kv_lora_rank + 1) * 4 * 16

    def _trtllm_mla_workspace(self) -> torch.Tensor:
        nbytes = self.max_bs * self.num_heads * (self.kv_lora_rank + 1) * 4 * 8 + (1 << 20)
        ws = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return ws

    # ------------------------------------------------------------ cuda graph

    def init_cuda_graph_state(self, buckets: List[int]) -> None:
        n = max(buckets)
        dev = self.device
        self.cuda_graph_qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_indices = torch.zeros(n * self.cfg.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.cuda_graph_kv_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.qo_indptr_host = torch.arange(n + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_lens_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        for bs in sorted(buckets, reverse=True):
            self.decode_wrappers[bs] = BatchMLAPagedAttentionWrapper(
                self.workspace_buffer,
                use_cuda_graph=True,
                qo_indptr=self.cuda_graph_qo_indptr[: bs + 1],
                kv_indptr=self.cuda_graph_kv_indptr[: bs + 1],
                kv_indices=self.cuda_graph_kv_indices,
                kv_len_arr=self.cuda_graph_kv_lens[:bs],
                backend=self.graph_backend,
            )
        self.cuda_graph_kv_indices.fill_(0)  # ok: FC104
        for bs, w in self.decode_wrappers.items():
            if w._backend == "fa3" and bs > 64:  # expect: FC103
                logger.warning("bucket %d resolved to FA3 MLA; large graph buckets run faster on fa2", bs)

    def _plan_graph(self, bs: int, padded: int, seq_lens_cpu: torch.Tensor, req_pages: List[np.ndarray]) -> None:
        lens = seq_lens_cpu[:bs].numpy()
        pages = (lens + self.page_size - 1) // self.page_size
        indptr = np.zeros(padded + 1, dtype=np.int32)
        indptr[1 : bs + 1] = np.cumsum(pages)
        indptr[bs + 1 :] = indptr[bs] + np.arange(1, padded - bs + 1, dtype=np.int32)
        pad = [np.zeros(padded - bs, dtype=np.int32)]
        flat = np.concatenate([req_pages[i][: pages[i]] for i in range(bs)] + pad).astype(np.int32)
        n = int(flat.size)

        self.kv_indptr_host[: padded + 1].copy_(torch.from_numpy(indptr))
        self.kv_lens_host[:bs].copy_(seq_lens_cpu[:bs])
        self.kv_lens_host[bs:padded] = 1
        self.cuda_graph_kv_indices[:n].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_indptr[: padded + 1].copy_(self.kv_indptr_host[: padded + 1], non_blocking=True)
        self.cuda_graph_kv_lens[:padded].copy_(self.kv_lens_host[:padded], non_blocking=True)
        self.decode_wrappers[padded].plan(  # ok: FC102
            self.qo_indptr_host[: padded + 1],
            self.kv_indptr_host[: padded + 1],
            self.cuda_graph_kv_indices[:n],
            self.kv_lens_host[:padded],
            self.num_heads,
            self.kv_lora_rank,
            self.rope_dim,
            self.page_size,
            False,
            self.sm_scale,
            self.dtype,
            self.dtype,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self._plan_graph(bs, bs, fb.seq_lens_cpu, fb.req_pages)
        fb.graph_bs = bs

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, padded: int, seq_lens_cpu: torch.Tensor, req_pages: List[np.ndarray]
    ) -> None:
        lens_view = self.cuda_graph_kv_lens[:padded]
        self._plan_graph(bs, padded, seq_lens_cpu, req_pages)
        # padded rows must add nothing to the output
        lens_view[bs:].zero_()  # expect: FC104

    def advance_kv_lens(self, bs: int) -> None:
        """After a replay: the next decode step of the same batch attends to one more token per row."""
        self.cuda_graph_kv_lens[:bs].add_(1)  # expect: FC104

    # ---------------------------------------------------------------- eager

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self._plan_eager_decode(fb)
            fb.graph_bs = None
            return
        if sum(fb.extend_seq_lens) > self.cfg.max_extend_tokens:  # expect: FC101
            raise ValueError(f"extend batch over max_extend_tokens={self.cfg.max_extend_tokens}")
        self._plan_extend(fb)

    def _plan_eager_decode(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        lens = fb.seq_lens_cpu[:bs].numpy()
        pages = (lens + self.page_size - 1) // self.page_size
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        flat = np.concatenate([fb.req_pages[i][: pages[i]] for i in range(bs)]).astype(np.int32)
        kv_indices = torch.from_numpy(flat).pin_memory().to(self.device, non_blocking=True)
        qo_indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr_host = torch.from_numpy(indptr)
        self.eager_decode.plan(  # expect: FC102
            qo_indptr_host,
            kv_indptr_host,
            kv_indices,
            fb.seq_lens,
            self.num_heads,
            self.kv_lora_rank,
            self.rope_dim,
            self.page_size,
            False,
            self.sm_scale,
            self.dtype,
            self.dtype,
        )
        self.draft_decode.plan(
            qo_indptr_host,
            kv_indptr_host,
            kv_indices,
            fb.seq_lens_cpu[:bs],
            self.num_heads,
            self.kv_lora_rank,
            self.rope_dim,
            self.page_size,
            False,
            self.sm_scale,
            self.dtype,
            self.dtype,
        )

    def _plan_extend(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        n_tokens = sum(fb.extend_seq_lens_cpu)  # ok: FC101
        if n_tokens == 0:
            return
        torch.cumsum(fb.extend_seq_lens, 0, dtype=torch.int32, out=self.qo_indptr_buf[1 : bs + 1])
        qo_indptr = self.qo_indptr_buf[: bs + 1]
        self.ragged_prefill.plan(  # expect: FC102
            qo_indptr,
            qo_indptr,
            self.num_heads,
            self.num_heads,
            self.cfg.qk_head_dim,
            head_dim_vo=self.cfg.v_head_dim,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=self.dtype,
        )

    # -------------------------------------------------------------- kernels

    def store_latent(self, layer_id: int, ckv: torch.Tensor, kpe: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        cache = self.latent_cache[layer_id]
        page, slot = out_cache_loc // self.page_size, out_cache_loc % self.page_size
        cache[page, slot] = torch.cat([ckv, kpe], dim=-1)

    def attn_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        cache = self.latent_cache[layer_id]
        if fb.graph_bs is None and fb.use_trtllm:
            out = trtllm_batch_decode_with_kv_cache_mla(
                query=torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1),
                kv_cache=cache.unsqueeze(1),
                workspace_buffer=self.trtllm_workspace,
                qk_nope_head_dim=self.cfg.qk_nope_head_dim,
                kv_lora_rank=self.kv_lora_rank,
                qk_rope_head_dim=self.rope_dim,
                block_tables=fb.block_table,
                seq_lens=fb.seq_lens,
                max_seq_len=fb.max_seq_len,
                bmm1_scale=self.sm_scale,
            )
            return out.squeeze(1)
        ckv, kpe = cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank :]
        if fb.graph_bs is not None:
            w = self.decode_wrappers[fb.graph_bs]
        else:
            w = self.eager_decode
        return w.run(q_nope, q_pe, ckv, kpe)  # ok: FC108

    def attn_draft_decode(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int, fb: ForwardBatch
    ) -> torch.Tensor:
        cache = self.latent_cache[layer_id]
        ckv, kpe = cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank :]
        return self.draft_decode.run(q_nope, q_pe, ckv, kpe)  # expect: FC108

    def attn_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)
