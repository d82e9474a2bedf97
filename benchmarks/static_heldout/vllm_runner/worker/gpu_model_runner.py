from dataclasses import dataclass

import numpy as np
import torch


class CpuGpuBuffer:
    def __init__(self, n, dtype, device):
        self.cpu = torch.zeros(n, dtype=dtype, pin_memory=True)
        self.gpu = torch.zeros(n, dtype=dtype, device=device)
        self.np = self.cpu.numpy()


@dataclass
class AttnMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor


class GPUModelRunner:
    def __init__(self, device, max_tokens):
        self.device = device
        self.input_ids = CpuGpuBuffer(max_tokens, torch.int32, device)
        self.positions_cpu = torch.zeros(max_tokens, dtype=torch.int64)
        self.req_indices_gpu = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.max_capture = 512
        self.use_cuda_graph = True

    def _prepare_inputs(self, qsl_np):
        qsl_cpu = torch.from_numpy(qsl_np)
        return AttnMetadata(query_start_loc=qsl_cpu.to(self.device, non_blocking=True), query_start_loc_cpu=qsl_cpu)

    def execute_model(self, scheduler_output, sampled_ids):
        meta = self._prepare_inputs(np.asarray(scheduler_output.qsl))
        num_tokens = int(meta.query_start_loc[-1])  # expect: FC101
        num_tokens_cpu = int(meta.query_start_loc_cpu[-1])  # ok: FC101
        positions = self.positions_cpu.numpy()  # ok: FC101
        self.input_ids.gpu[:num_tokens_cpu].copy_(self.input_ids.cpu[:num_tokens_cpu], non_blocking=True)  # ok: FC101
        valid = sampled_ids[sampled_ids != -1]  # expect: FC101
        req_ids = [int(r) for r in self.req_indices_gpu]  # expect: FC101
        torch.cuda.current_stream().synchronize()  # expect: FC101
        if self.use_cuda_graph and num_tokens_cpu <= self.max_capture:  # ok: FC101
            pass
        return num_tokens, positions, valid, req_ids
