import torch

from radix_srv.forward_batch import ForwardBatch


class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        args = model_runner.server_args
        self.capture_bs = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= args.max_running_requests]
        self.max_bs = self.capture_bs[-1]
        dev = model_runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros((self.max_bs, args.max_pages_per_seq), dtype=torch.int32, device=dev)
        self.graphs = {}
        self.outputs = {}
        self.pool = None

    def capture(self):
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs):
        # longest sequence the captured trtllm fallback will be asked to handle
        max_len = int(self.seq_lens[:bs].max())  # expect: FC101
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, max_len)
        w = self.attn_backend.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for {bs} was built for another batch size")
        fb = ForwardBatch.for_capture(bs, self.input_ids[:bs], self.positions[:bs], self.seq_lens[:bs], self.block_tables[:bs])
        model = self.model_runner.model

        def run_once():
            return model.decode(self.input_ids[:bs], self.positions[:bs], fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def can_run(self, fb):
        return fb.batch_size <= self.max_bs and not fb.shared_prefix_pages

    def replay(self, fb):
        bs = fb.batch_size
        bucket = next(b for b in self.capture_bs if b >= bs)
        seq_lens_host = fb.seq_lens.cpu()  # expect: FC101
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.block_tables[:bs].copy_(fb.block_tables)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bucket, bs, seq_lens_host, fb.kv_indices_np)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:bs]
