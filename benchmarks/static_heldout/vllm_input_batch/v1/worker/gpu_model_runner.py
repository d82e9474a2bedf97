from contextlib import contextmanager

import torch

from v1.attention.flashinfer import CommonAttentionMetadata, FlashInferMetadataBuilder
from v1.sample.ops.topk_topp_sampler import TopKTopPSampler
from v1.worker.gpu_input_batch import InputBatch


class GPUModelRunner:
    def __init__(self, vllm_config, device: torch.device):
        self.device = device
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.input_batch = InputBatch(self.max_num_reqs, vllm_config.model_config.max_model_len, device, True)
        self.builder = FlashInferMetadataBuilder(vllm_config, device, use_trtllm=False)
        self.sampler = TopKTopPSampler()
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.kv_cache = None
        self._capturing = False

    @contextmanager
    def graph_capture(self):
        self._capturing = True
        try:
            yield torch.cuda.CUDAGraph()
        finally:
            self._capturing = False

    def _common(self, n: int) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            self.query_start_loc[: n + 1], self.query_start_loc_cpu[: n + 1], self.seq_lens[:n], self.seq_lens_cpu[:n], n
        )

    def capture_model(self, sizes: list):
        for bs in sizes:
            common = self._common(bs)
            wrapper = self.builder.build_for_cudagraph_capture(common)
            q = torch.zeros(bs, 32, 128, device=self.device, dtype=torch.bfloat16)
            with self.graph_capture() as g, torch.cuda.graph(g):
                self.builder.run_decode(wrapper, q, self.kv_cache)
                self.builder.run_eager(q, self.kv_cache)

    def execute_model(self, scheduler_output, logits: torch.Tensor):
        meta = self.input_batch.refresh_metadata()
        n = scheduler_output.num_reqs
        common = self._common(n)
        self.builder.build(common)
        total = int(common.query_start_loc_cpu[n])  # ok: FC101
        num_scheduled = common.query_start_loc[n].item()  # expect: FC101
        sampled = self.sampler.forward_cuda(logits[:total], meta)
        lens = self.seq_lens_cpu[:n].tolist()  # ok: FC101
        return sampled[:num_scheduled], lens
