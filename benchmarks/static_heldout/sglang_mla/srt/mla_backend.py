import os
from dataclasses import dataclass

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

WS_BYTES = int(os.getenv("MLA_WS_MB", "128")) * 1024 * 1024


@dataclass
class ForwardBatch:
    seq_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    extend_seq_lens_cpu: list
    batch_size: int


def make_batch(seq_lens, extend, device):
    return ForwardBatch(
        seq_lens=torch.as_tensor(seq_lens, dtype=torch.int32, device=device),
        extend_seq_lens=torch.as_tensor(extend, dtype=torch.int32, device=device),
        extend_seq_lens_cpu=list(extend),
        batch_size=len(seq_lens),
    )


class MLABackend:
    def __init__(self, device, max_bs, server_args):
        self.device = device
        self.ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.other_ws = torch.empty(server_args.ws_mb << 20, dtype=torch.uint8, device=device)  # ok: FC106
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * 512, dtype=torch.int32, device=device)
        self.wrappers = {
            "ragged": BatchPrefillWithRaggedKVCacheWrapper(self.ws, "NHD"),
            "decode": BatchDecodeWithPagedKVCacheWrapper(self._gen_ws(), "HND", backend="trtllm-gen"),
        }

    def _gen_ws(self):
        return torch.empty(64 << 20, dtype=torch.uint8, device=self.device)  # expect: FC105

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        total = forward_batch.seq_lens.sum().item()  # expect: FC101
        if forward_batch.extend_seq_lens.max() > 1:  # expect: FC101
            pass
        if max(forward_batch.extend_seq_lens_cpu) > 1:  # ok: FC101
            pass
        bs = forward_batch.batch_size
        self.qo_indptr[1 : bs + 1] = torch.cumsum(forward_batch.extend_seq_lens, 0)
        prefill = self.wrappers["ragged"]
        prefill.begin_forward(self.qo_indptr[: bs + 1], self.qo_indptr[: bs + 1], 16, 16, 192)  # expect: FC102
        layout = prefill._kv_layout  # expect: FC103
        self.kv_indices = torch.empty(total, dtype=torch.int32, device=self.device)  # expect: FC107
        return layout
