import os
from typing import TYPE_CHECKING

import torch

from lightllm.models.llama.flashinfer_struct import LlamaFlashInferStateInfo

if TYPE_CHECKING:
    from lightllm.common.basemodel.cuda_graph import CudaGraph

FLASHINFER_WS_MB = int(os.getenv("LIGHTLLM_FLASHINFER_WS_MB", "256"))


class FlashInferStateExtraInfo:
    __slots__ = ("tp_q_head_num", "tp_kv_head_num", "head_dim", "workspace_buffer", "kv_indices_buffer",
                 "q_data_type", "kv_data_type")

    def __init__(self, model, max_total_tokens: int):
        self.tp_q_head_num = model.config["num_attention_heads"] // model.world_size
        self.tp_kv_head_num = max(model.config["num_key_value_heads"] // model.world_size, 1)
        self.head_dim = model.config["hidden_size"] // model.config["num_attention_heads"]
        self.q_data_type = model.data_type
        self.kv_data_type = model.data_type
        self.workspace_buffer = torch.empty(FLASHINFER_WS_MB << 20, dtype=torch.int8, device="cuda")  # expect: FC106
        self.kv_indices_buffer = [
            torch.empty(max_total_tokens, dtype=torch.int32, device="cuda"),  # ok: FC106
            torch.empty(max_total_tokens, dtype=torch.int32, device="cuda"),
        ]


class TpPartBaseModel:
    infer_state_class = LlamaFlashInferStateInfo

    def __init__(self, kvargs):
        self.config = kvargs["config"]
        self.world_size = kvargs["world_size"]
        self.data_type = torch.bfloat16
        self.graph_max_batch_size = kvargs.get("graph_max_batch_size", 0)
        self.max_total_token_num = kvargs["max_total_token_num"]
        self.req_manager = kvargs["req_manager"]
        self.flashinfer_extra_state = FlashInferStateExtraInfo(self, self.max_total_token_num)
        self.graph: "CudaGraph" = None
        if self.graph_max_batch_size:
            from lightllm.common.basemodel.cuda_graph import CudaGraph

            self.graph = CudaGraph(self, self.graph_max_batch_size)

    def forward(self, batch_size, input_ids, b_req_idx, b_seq_len_cpu, b_ready_cache_len_cpu, is_prefill):
        assert batch_size == len(b_seq_len_cpu), "batch size mismatch"  # expect: FC109
        infer_state = self.infer_state_class()
        infer_state.batch_size = batch_size
        infer_state.is_prefill = is_prefill
        infer_state.req_manager = self.req_manager
        infer_state.b_req_idx = b_req_idx
        infer_state.b_seq_len_cpu = b_seq_len_cpu
        infer_state.b_ready_cache_len_cpu = b_ready_cache_len_cpu
        infer_state.b_seq_len = b_seq_len_cpu.cuda(non_blocking=True)
        infer_state.b_ready_cache_len = b_ready_cache_len_cpu.cuda(non_blocking=True)
        infer_state.init_some_extra_state(self, input_ids)
        if self.graph is not None and not is_prefill and batch_size <= self.graph_max_batch_size:
            if self.graph.need_capture(batch_size):
                return self.graph.capture_decode(input_ids, infer_state)
            return self.graph.replay(input_ids, infer_state)
        return self.decode_step(input_ids, infer_state)

    def decode_step(self, input_ids, infer_state: LlamaFlashInferStateInfo):
        q, kv = self._embed(input_ids), self.req_manager.kv_buffer
        out = infer_state.decode_wrapper.run(q, kv)  # ok: FC108
        if infer_state.prefill_wrapper is not None:
            out = infer_state.prefill_wrapper.run(q, kv)  # expect: FC108
        return out

    def _embed(self, input_ids):
        return self.req_manager.embed(input_ids)
