from typing import TYPE_CHECKING, Dict

import torch

if TYPE_CHECKING:
    from retroserve.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.max_bs = model_runner.settings.max_graph_bs
        dev = model_runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.neighbour_enc = torch.zeros(
            self.max_bs, model_runner.settings.num_heads * model_runner.settings.head_dim, device=dev
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs = {}
        self.out_cpu = None

    def capture(self):
        self.model_runner.attn_backend.init_cuda_graph_state()
        for bs in range(1, self.max_bs + 1):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        mr = self.model_runner
        fb = mr.dummy_batch(bs)
        lens = self.seq_lens[:bs].tolist()  # expect: FC101
        mr.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = mr.model(self.input_ids[:bs], mr.kv_caches, fb)
        self.graphs[bs] = g
        self.outputs[bs] = out
        return lens

    def replay(self, fb):
        bs = fb.batch_size
        self.input_ids[:bs].copy_(fb.input_ids)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        if fb.neighbour_states is not None:
            self.neighbour_enc = fb.neighbour_states.clone()  # expect: FC107
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.out_cpu = torch.empty(bs, dtype=torch.long, pin_memory=True)  # ok: FC107
        self.graphs[bs].replay()
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return self.outputs[bs]
