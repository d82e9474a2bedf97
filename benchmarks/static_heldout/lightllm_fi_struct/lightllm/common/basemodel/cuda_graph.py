from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightllm.models.llama.model import TpPartBaseModel


class CudaGraph:
    def __init__(self, model: "TpPartBaseModel", max_batch_size: int):
        self.model = model
        self.graphs = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.max_batch_size = max_batch_size
        self.input_ids_buf = torch.zeros(max_batch_size, dtype=torch.int64, device="cuda")

    def need_capture(self, batch_size):
        return batch_size not in self.graphs

    def capture_decode(self, input_ids, infer_state):
        bs = input_ids.shape[0]
        self.input_ids_buf[:bs].copy_(input_ids)
        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            self.model.decode_step(self.input_ids_buf[:bs], infer_state)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.decode_step(self.input_ids_buf[:bs], infer_state)
        self.graphs[bs] = (graph, out, infer_state)
        return out

    def replay(self, input_ids, infer_state):
        bs = input_ids.shape[0]
        if self.input_ids_buf.numel() < bs:
            self.input_ids_buf = torch.zeros(bs, dtype=torch.int64, device="cuda")  # expect: FC107
        graph, out, captured_state = self.graphs[bs]
        captured_state.copy_for_cuda_graph(infer_state)
        self.input_ids_buf[:bs].copy_(input_ids)
        graph.replay()
        return out
