import torch

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.v1.attention.backends.flashinfer_cascade import (
    FlashInferCascadeImpl,
    FlashInferCascadeMetadataBuilder,
)
from vllm.v1.attention.backends.utils import AttentionMetadataBuilderProto, CommonAttentionMetadata


class GPUModelRunner:
    def __init__(self, vllm_config, device):
        self.device = device
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.builder: AttentionMetadataBuilderProto = FlashInferCascadeMetadataBuilder(vllm_config, device)
        self.impl = FlashInferCascadeImpl()
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.block_table = torch.zeros(self.max_num_reqs, 512, dtype=torch.int32, device=device)
        self.cudagraph_sizes = [1, 2, 4, 8, 16, 32, 64]
        self.graphed = CUDAGraphWrapper(self._model_step)

    def _common(self, num_reqs, num_tokens):
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            block_table_tensor=self.block_table[:num_reqs],
        )

    def _model_step(self, q, kv_cache, attn_metadata):
        return self.impl.forward(None, q, kv_cache, attn_metadata)

    def _dummy_run(self, num_tokens, q, kv_cache):
        common = self._common(num_tokens, num_tokens)
        attn_metadata = self.builder.build_for_cudagraph_capture(common)
        num_scheduled = int(self.query_start_loc[num_tokens])  # expect: FC101
        num_scheduled_cpu = int(self.query_start_loc_cpu[num_tokens])  # ok: FC101
        return self._model_step(q[:num_scheduled_cpu], kv_cache, attn_metadata), num_scheduled

    def capture_model(self, q, kv_cache):
        for bs in reversed(self.cudagraph_sizes):
            torch.cuda.synchronize()  # ok: FC101
            self._dummy_run(bs, q, kv_cache)
        torch.cuda.synchronize()

    def execute_model(self, scheduler_output, q, kv_cache):
        num_reqs = scheduler_output.num_reqs
        attn_metadata = self.builder.build(scheduler_output.common_prefix_len, self._common(num_reqs, q.shape[0]))
        return self.graphed(num_reqs, q, kv_cache, attn_metadata)
