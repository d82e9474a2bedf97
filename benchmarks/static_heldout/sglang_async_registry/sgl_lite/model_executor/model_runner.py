import torch

from sgl_lite.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sgl_lite.layers.attention.registry import create_backend
from sgl_lite.model_executor.forward_batch_info import ForwardBatch


class ModelRunner:
    def __init__(self, server_args, model_config, device="cuda"):
        self.device = device
        self.model_config = model_config
        self.max_running_requests = server_args.max_running_requests
        self.num_heads = model_config.num_attention_heads
        self.num_kv_heads = model_config.num_key_value_heads
        self.head_dim = model_config.head_dim
        self.attn_backend: FlashInferAttnBackend = create_backend(server_args.attention_backend, self)

    def forward_decode(self, q, kv_cache, forward_batch):
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.attn_backend.forward_decode(q, kv_cache, forward_batch, forward_batch.use_sliding_window)


class CudaGraphRunner:
    def __init__(self, model_runner: ModelRunner, capture_bs=(1, 2, 4, 8, 16)):
        self.model_runner = model_runner
        self.capture_bs = capture_bs
        self.graphs = {}
        self.outputs = {}
        self.seq_lens = torch.ones(max(capture_bs), dtype=torch.int32, device=model_runner.device)

    def capture_one_batch_size(self, bs, q, kv_cache, forward_batch):
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata_capture_cuda_graph(bs, self.seq_lens[:bs])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend.forward_decode(q, kv_cache, forward_batch, forward_batch.use_sliding_window)
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, bs, forward_batch: ForwardBatch):
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(bs, forward_batch.seq_lens, forward_batch.seq_lens_cpu)
        self.graphs[bs].replay()
        return self.outputs[bs]
