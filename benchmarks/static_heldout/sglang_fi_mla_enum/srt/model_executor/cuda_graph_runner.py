"""Graph runner shaped like SGLang's CudaGraphRunner, with a nested run_once closure."""

import torch

from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.max_bs = model_runner.req_to_token_pool.size
        self.device = model_runner.device
        self.seq_lens = torch.ones((self.max_bs,), dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones((self.max_bs,), dtype=torch.int32)
        self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64, device=self.device)
        self.graphs = {}

    def capture_one_batch_size(self, bs: int, q: torch.Tensor, kv_cache: torch.Tensor):
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            extend_prefix_lens_cpu=[],
        )
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, bs, fb)

        def run_once():
            return self.attn_backend.forward_decode(q[:bs], kv_cache, bs)

        torch.cuda.synchronize()  # ok: FC101
        total = fb.seq_lens.sum().item()  # expect: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run_once()
        self.graphs[bs] = (graph, out, total)

    def replay(self, forward_batch: ForwardBatch):
        bs = forward_batch.batch_size
        *_, raw_bs = (0, 0, bs)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
        fb = ForwardBatch(ForwardMode.DECODE, raw_bs, self.req_pool_indices[:raw_bs], self.seq_lens[:raw_bs], self.seq_lens_cpu[:raw_bs], [])
        self.attn_backend.init_forward_metadata_replay_cuda_graph(raw_bs, fb)
        graph, out, _ = self.graphs[raw_bs]
        graph.replay()
        return out
