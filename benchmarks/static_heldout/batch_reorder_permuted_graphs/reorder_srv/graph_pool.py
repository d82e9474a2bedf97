import torch

from reorder_srv.meta import DecodeMeta


class PermutedGraphPool:
    """Decode graphs per bucket; each reads the backend's sorted inputs and sorted page lists."""

    def __init__(self, model, backend, limits):
        self.model = model
        self.backend = backend
        self.limits = limits
        self.graphs = {}
        self.outputs = {}
        self.pool = None

    def record_all(self):
        for bucket in sorted(self.limits.buckets, reverse=True):
            self.record(bucket)

    def record(self, bucket):
        w = self.backend.bind_bucket(bucket)
        if w._paged_kv_indices_buf.data_ptr() != self.backend.kv_indices.data_ptr():  # expect: FC103
            raise RuntimeError("the graph wrapper copied kv_indices; the permutation kernel would write a stale copy")
        meta = DecodeMeta.for_capture(bucket)
        self.backend.plan_for_capture(meta)
        backend = self.backend

        def body():
            return self.model.decode_graph(backend.sorted_ids[:bucket], backend.sorted_positions[:bucket], meta)

        body()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bucket] = body()
        self.pool = graph.pool()
        self.graphs[bucket] = graph

    def replay_bucket(self, meta, ids_dev, pos_dev):
        assert self.pool is not None  # ok: FC109
        bs = meta.bs
        perm = self.backend.perm_dev[:bs]
        self.backend.prepare_permuted(meta)
        self.backend.sorted_ids[:bs].copy_(ids_dev[perm])
        self.backend.sorted_positions[:bs].copy_(pos_dev[perm])
        self.graphs[meta.bucket].replay()
        return self.outputs[meta.bucket][:bs]
