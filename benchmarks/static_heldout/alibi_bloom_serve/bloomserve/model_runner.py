from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch
import triton

from bloomserve.backend.flashinfer_alibi import AlibiFlashInferBackend
from bloomserve.forward_batch import ChunkMeta, ForwardBatch, ForwardMode
from bloomserve.graph_runner import CudaGraphRunner
from bloomserve.kernels import remap_indices_kernel
from bloomserve.model import BloomForCausalLM
from bloomserve.server_args import ModelConfig, ServerArgs


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_config: ModelConfig, device: str = "cuda"):
        self.server_args = server_args
        self.model_config = model_config
        self.device = torch.device(device)
        heads = model_config.num_heads // server_args.tp_size
        total_tokens = server_args.max_running_requests * server_args.max_context_len
        self.req_to_token = torch.zeros(server_args.max_running_requests, server_args.max_context_len,
                                        dtype=torch.int32, device=self.device)
        self.kv_pool = [torch.empty(total_tokens, 2, heads, model_config.head_dim, dtype=torch.bfloat16,
                                    device=self.device) for _ in range(model_config.num_layers)]
        self.attn_backend = AlibiFlashInferBackend(self)
        self.model = BloomForCausalLM(model_config, server_args.tp_size, self.attn_backend).to(self.device)
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()

    def make_batch(self, mode: ForwardMode, input_ids: np.ndarray, positions: np.ndarray, out_loc: np.ndarray,
                   req_pool_indices: Sequence[int], seq_lens: Sequence[int],
                   extend_lens: List[int] = (), prefix_lens: List[int] = ()) -> ForwardBatch:
        seq_lens_cpu = torch.tensor(list(seq_lens), dtype=torch.int32)
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=len(seq_lens),
            input_ids=torch.from_numpy(input_ids).to(self.device, non_blocking=True),
            positions=torch.from_numpy(positions).to(self.device, non_blocking=True),
            out_cache_loc=torch.from_numpy(out_loc).to(self.device, non_blocking=True),
            req_pool_indices=torch.tensor(list(req_pool_indices), dtype=torch.int32, device=self.device),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
        )
        if mode == ForwardMode.EXTEND:
            fb.extend_seq_lens_cpu = list(extend_lens)
            fb.extend_seq_lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32, device=self.device)
            fb.extend_num_tokens = int(sum(extend_lens))
            if max(extend_lens, default=0) > self.server_args.chunked_prefill_size:
                fb.long_prompt_chunks = ChunkMeta.from_lengths(list(extend_lens), list(prefix_lens),
                                                               self.attn_backend.kv_indices)
        return fb

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def defragment(self, remap: torch.Tensor) -> None:
        """Called by the scheduler after the KV pool compacts tokens: rename the pages the graphs will read."""
        self.req_to_token.copy_(remap[self.req_to_token.long()])
        buf = self.attn_backend.decode_wrappers[self.graph_runner.max_bs]._paged_kv_indices_buf  # expect: FC103
        n = buf.numel()
        remap_indices_kernel[(triton.cdiv(n, 1024),)](buf, remap, n, BLOCK=1024)  # expect: FC104
