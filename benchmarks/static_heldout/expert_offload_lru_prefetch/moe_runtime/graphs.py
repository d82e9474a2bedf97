import torch

from moe_runtime.batch import ForwardBatch


class DecodeGraphRunner:
    """One CUDA graph per decode bucket, captured largest first into a shared memory pool."""

    def __init__(self, model, attn, cfg, device):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        self.device = device
        mb = cfg.max_batch
        self.static_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(mb, dtype=torch.int32, device=device)
        self.static_block_tables = torch.zeros((mb, cfg.max_seq_len // cfg.page_size), dtype=torch.int32, device=device)
        self.graphs = {}
        self.outputs = {}
        self.pool = None
        self.attn.init_cuda_graph_state(mb)

    def capture(self):
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs):
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        fb = ForwardBatch.for_graph(
            bs,
            self.static_ids[:bs],
            self.static_positions[:bs],
            self.static_block_tables[:bs],
            self.static_seq_lens[:bs],
            self.cfg.window_layers,
        )

        def run_once():
            return self.model.decode_graph(self.static_ids[:bs], self.static_positions[:bs], fb)

        for _ in range(2):
            run_once()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, fb):
        bs, bucket = fb.bs, fb.bucket
        self.static_ids[:bs].copy_(fb.input_ids)
        # positions arrive already padded to the batch; keep the runner's copy
        self.static_positions = fb.positions.clone()  # expect: FC107
        self.static_seq_lens[:bs].copy_(fb.seq_lens_dev)
        self.attn.init_forward_metadata_replay_cuda_graph(bs, bucket, fb.seq_lens_cpu, fb.kv_indices_np)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:bs]
