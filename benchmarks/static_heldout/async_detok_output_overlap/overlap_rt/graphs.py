import torch

from overlap_rt.metadata import StepMetadata


class StepGraphs:
    def __init__(self, model, attn, settings, device):
        self.model = model
        self.attn = attn
        self.settings = settings
        mb = settings.max_batch
        self.input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.page_counts = torch.zeros(mb, dtype=torch.int32, device=device)
        self.graphs = {}
        self.outputs = {}
        self.pool = None

    def record_all(self):
        self.attn.init_graph_buffers()
        for bs in sorted(self.settings.graph_buckets, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs):
        self.attn.bind_bucket(bs)
        meta = StepMetadata.dummy(bs, self.input_ids[:bs], self.positions[:bs], self.settings.share_system_prompt)
        self.attn.plan_bucket(meta)

        def body():
            return self.model.decode_graph(self.input_ids[:bs], self.positions[:bs], meta)

        body()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = body()
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, meta):
        bs, bucket = meta.bs, meta.bucket
        self.input_ids[:bs].copy_(meta.input_ids)
        self.positions[:bs].copy_(meta.positions)
        self.page_counts[:bs].copy_(torch.from_numpy(meta.pages_np), non_blocking=True)
        self.attn.plan_bucket(meta)
        # the sampler's per-row page offsets want the device indptr; rebuild it from the page counts
        torch.cumsum(self.page_counts[:bs], 0, dtype=torch.int32, out=self.attn.kv_indptr[1 : bs + 1])  # expect: FC104
        self.graphs[bucket].replay()
        return self.outputs[bucket][:bs]
