import torch

from tensorrt_llm._torch.attention_backend.flashinfer_mla import FlashInferMLAMetadata
from tensorrt_llm._torch.attention_backend.workspace import forced_graph_mode


class DecodingCUDAGraphRunner:
    def __init__(self, max_batch_size: int, metadata: FlashInferMLAMetadata, pool=None):
        self.max_batch_size = max_batch_size
        self.attn_metadata = metadata
        self.pool = pool
        self.graphs = {}
        self.seq_slots_buf = torch.zeros(max_batch_size, dtype=torch.int32, device="cuda")
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.int64, device="cuda")

    def _check_batch_size(self, batch_size):
        assert 0 < batch_size <= self.max_batch_size  # expect: FC109

    def warmup(self, batch_size, q_nope, q_pe, ckv, kpe):
        self.attn_metadata.reset_for_dummy_request()
        return self.attn_metadata.run_decode(q_nope, q_pe, ckv, kpe)

    def record(self, batch_size, q_nope, q_pe, ckv, kpe, q, k, v):
        self._check_batch_size(batch_size)
        slots = self.seq_slots_buf[:batch_size].tolist()  # expect: FC101
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with forced_graph_mode(self.attn_metadata._mla_wrapper), torch.cuda.graph(graph, pool=self.pool):
            out = self.attn_metadata.run_decode(q_nope, q_pe, ckv, kpe)
            if self.attn_metadata.num_contexts:
                out = self.attn_metadata.run_context(q, k, v)
        self.graphs[batch_size] = (graph, out, slots)
        return out

    def replay(self, batch_size):
        graph, out, _ = self.graphs[batch_size]
        graph.replay()
        return out
