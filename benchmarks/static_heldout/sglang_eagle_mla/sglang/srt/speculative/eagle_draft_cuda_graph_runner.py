from __future__ import annotations

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend
from sglang.srt.speculative.spec_info import EagleDraftInput


class EAGLEDraftCudaGraphRunner:
    def __init__(self, attn_backend: FlashInferMLAAttnBackend, draft_model, topk, speculative_num_steps, max_bs):
        self.attn_backend = attn_backend
        self.draft_model = draft_model
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.capture_bs = [1, 2, 4, 8, 16, 32]
        self.graphs = {}
        self.outputs = {}
        self.attn_backend.init_cuda_graph_state(max_bs)
        self.extend_wrapper = BatchPrefillWithRaggedKVCacheWrapper(attn_backend.workspace_buffer, "NHD")
        with torch.device(attn_backend.device):
            self.seq_lens = torch.ones(max_bs, dtype=torch.int32)
            self.hidden_states = torch.zeros(max_bs, draft_model.hidden_size, dtype=torch.bfloat16)
        self.seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32)
        self.spec_info = EagleDraftInput(
            topk_p=torch.zeros(max_bs, topk, device=attn_backend.device),
            topk_index=torch.zeros(max_bs, topk, dtype=torch.int64, device=attn_backend.device),
            accept_length=torch.ones(max_bs, dtype=torch.int32, device=attn_backend.device),
        )

    def record_graph(self, bs: int):
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, bs * self.topk, self.seq_lens_cpu)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph):
            out = self._draft_steps(bs)
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def _draft_steps(self, bs: int):
        hidden = self.hidden_states[:bs]
        accept = self.spec_info.accept_length[:bs].tolist()  # expect: FC101
        outs = []
        for step in range(self.speculative_num_steps):
            q_nope, q_pe, ckv, kpe = self.draft_model.project(hidden, step)
            outs.append(self.attn_backend.forward_decode(q_nope, q_pe, ckv, kpe))
            self.attn_backend.cuda_graph_kv_lens[:bs] += 1  # expect: FC104
        q, k, v = self.draft_model.extend_qkv(hidden)
        outs.append(self.extend_wrapper.run(q, k, v))  # expect: FC108
        return outs, accept

    def replay(self, bs: int, forward_batch):
        self.seq_lens[:bs].copy_(forward_batch.seq_lens)
        self.seq_lens_cpu[:bs].copy_(forward_batch.seq_lens_cpu)  # ok: FC101
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, self.seq_lens, self.seq_lens_cpu)
        self.graphs[bs].replay()
        return self.outputs[bs]
