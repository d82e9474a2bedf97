"""FlashInfer attention with ALiBi positions (`pos_encoding_mode="ALIBI"`), page size 1 over `req_to_token`."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from bloomserve.alibi import get_alibi_slopes, shard_slopes
from bloomserve.forward_batch import ForwardBatch
from bloomserve.kernels import create_kv_indices

_WORKSPACE_MB = {"chunked_prefill": 512}


class AlibiFlashInferBackend:
    def __init__(self, model_runner):
        args = model_runner.server_args
        cfg = model_runner.model_config
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token
        self.kv_pool = model_runner.kv_pool
        self.num_heads = cfg.num_heads // args.tp_size
        self.head_dim = cfg.head_dim
        self.train_len = cfg.train_len
        self.alibi_window = args.alibi_window
        self.use_window = False
        self.tp_rank, self.tp_size = args.tp_rank, args.tp_size
        max_bs = args.max_running_requests

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_bs * args.max_context_len, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        # RoPE checkpoints served by the same runtime decode on trtllm-gen, whose workspace must start zeroed
        self.decode_backend = "fa2" if cfg.uses_alibi else "trtllm-gen"
        self.pos_mode = "ALIBI" if cfg.uses_alibi else "NONE"
        decode_ws = torch.empty(args.decode_workspace_bytes(self.num_heads, self.head_dim), dtype=torch.uint8, device=self.device)  # ok: FC105
        decode_ws.fill_(0)
        self.decode_workspace = decode_ws
        self.prefill_workspace = torch.empty(args.prefill_workspace_bytes(self.num_heads, self.head_dim), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.chunk_workspace = torch.zeros(_WORKSPACE_MB["chunked_prefill"] << 20, dtype=torch.uint8, device=self.device)  # expect: FC106

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=self.decode_backend)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=self.decode_backend)
        self.prefill_paged = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.prefill_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.chunk_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.chunk_workspace, "NHD", backend="fa2")
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.alibi_slopes: Optional[torch.Tensor] = None
        self.extend_lens_host: Optional[torch.Tensor] = None
        self._plan_info = None  # ok: FC103

    # ------------------------------------------------------------ per-step (eager)
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            max_len = int(fb.seq_lens.max())  # expect: FC101
            self.use_window = self.alibi_window and max_len > self.train_len
            self._plan_eager_decode(fb)
        else:
            self._plan_extend(fb)

    def _plan_eager_decode(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        indptr_np = self.kv_indptr_cpu.numpy()
        indptr_np[0] = 0
        np.cumsum(fb.seq_lens_cpu.numpy(), out=indptr_np[1 : bs + 1])
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        create_kv_indices[(bs,)](self.req_to_token, fb.req_pool_indices, self.kv_indptr, self.kv_indices,
                                 self.req_to_token.shape[1], BLOCK=512)
        self.eager_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                               self.num_heads, self.num_heads, self.head_dim, 1, pos_encoding_mode=self.pos_mode,
                               q_data_type=torch.bfloat16)
        if self.use_window:
            self.window_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                                    self.num_heads, self.num_heads, self.head_dim, 1, window_left=self.train_len,
                                    pos_encoding_mode=self.pos_mode, q_data_type=torch.bfloat16)
        self._plan_info = (bs, int(indptr_np[bs]))

    def _plan_extend(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if bs + 1 > self.qo_indptr.numel():
            self.qo_indptr.resize_(bs + 1)  # expect: FC107
        self.extend_lens_host = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32)  # ok: FC107
        self.qo_indptr[1 : bs + 1] = torch.cumsum(fb.extend_seq_lens, 0)
        self.kv_indptr[1 : bs + 1] = torch.cumsum(fb.seq_lens, 0)
        create_kv_indices[(bs,)](self.req_to_token, fb.req_pool_indices, self.kv_indptr, self.kv_indices,
                                 self.req_to_token.shape[1], BLOCK=512)
        rows = torch.arange(bs, device=self.device)
        token_to_req = torch.repeat_interleave(rows, fb.extend_seq_lens, output_size=fb.extend_num_tokens)  # ok: FC101
        offsets = torch.arange(fb.extend_num_tokens, device=self.device) - self.qo_indptr[:bs][token_to_req]
        fb.positions.copy_((fb.seq_lens - fb.extend_seq_lens)[token_to_req] + offsets)
        qo_indptr_host = torch.from_numpy(np.cumsum([0] + list(fb.extend_seq_lens_cpu)).astype(np.int32))
        self.prefill_paged.begin_forward(qo_indptr_host, self.kv_indptr[: bs + 1], self.kv_indices,  # expect: FC102
                                         self.kv_last_page_len_cpu[:bs], self.num_heads, self.num_heads,
                                         self.head_dim, 1, causal=True, pos_encoding_mode=self.pos_mode)
        if fb.long_prompt_chunks is not None:
            cm = fb.long_prompt_chunks
            self.chunk_wrapper.plan(cm.qo_indptr, cm.kv_indptr_host, cm.kv_indices, cm.kv_last_page_len_host,  # expect: FC102
                                    self.num_heads, self.num_heads, self.head_dim, 1, causal=True,
                                    pos_encoding_mode=self.pos_mode)
        if self.alibi_slopes is None:
            slopes = shard_slopes(get_alibi_slopes(self.num_heads * self.tp_size), self.tp_rank, self.tp_size)
            self.alibi_slopes = torch.tensor(slopes, dtype=torch.float32, device=self.device)  # ok: FC107

    # ------------------------------------------------------------ cuda graphs
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_indices.zero_()  # ok: FC104
        self.kv_last_page_len.fill_(1)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        self.decode_wrappers[bs] = w
        self.use_window = self.alibi_window
        self._update_decode(w, bs, req_pool_indices, seq_lens_cpu)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        w = self.decode_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was captured for another batch size")
        self._update_decode(w, bs, req_pool_indices, seq_lens_cpu)

    def _update_decode(self, w, bs: int, req_pool_indices, seq_lens_cpu) -> None:
        indptr_np = self.kv_indptr_cpu.numpy()
        indptr_np[0] = 0
        np.cumsum(seq_lens_cpu[:bs].numpy(), out=indptr_np[1 : bs + 1])
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        create_kv_indices[(bs,)](self.req_to_token, req_pool_indices, self.kv_indptr, self.kv_indices,  # ok: FC104
                                 self.req_to_token.shape[1], BLOCK=512)
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],  # ok: FC102
               self.num_heads, self.num_heads, self.head_dim, 1, pos_encoding_mode=self.pos_mode,
               q_data_type=torch.bfloat16)
        if self.use_window:
            self.window_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                                    self.num_heads, self.num_heads, self.head_dim, 1, window_left=self.train_len,
                                    pos_encoding_mode=self.pos_mode, q_data_type=torch.bfloat16)

    # ------------------------------------------------------------ forward
    def save_kv(self, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor, layer_id: int) -> None:
        cache = self.kv_pool[layer_id]
        cache[loc, 0] = k
        cache[loc, 1] = v

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool[layer_id].unsqueeze(2)
        if self.use_window and layer_id % 2 == 1:
            return self.window_decode.run(q, kv)  # expect: FC108
        w = self.decode_wrappers.get(fb.batch_size, self.eager_decode)
        return w.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool[layer_id].unsqueeze(2)
        if fb.long_prompt_chunks is not None:
            return self.chunk_wrapper.run(q, kv)
        return self.prefill_paged.run(q, kv)

    def sdpa_fallback(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Reference path used by the accuracy checker: explicit ALiBi bias."""
        n = q.shape[0]
        pos = torch.arange(n, device=q.device)
        bias = (pos[None, :] - pos[:, None]).clamp(max=0).float()
        bias = self.alibi_slopes[:, None, None] * bias[None]
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              attn_mask=bias, is_causal=False).transpose(0, 1)
