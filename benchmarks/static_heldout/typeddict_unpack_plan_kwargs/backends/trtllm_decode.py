"""trtllm-gen decode without a planner, for decode batches above the largest captured bucket."""
from typing import Any, Dict, List

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tdengine.plan_types import DecodeMeta, ServeConfig


class TrtllmDecode:
    """One workspace per scheduler stream: the overlap scheduler runs two batches at once."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self._backend = "trtllm-gen"  # ok: FC103
        nbytes = cfg.max_running_requests * cfg.num_qo_heads * cfg.head_dim * 64
        overlap_ws = torch.empty(nbytes, dtype=torch.uint8, device=cfg.device)  # ok: FC105
        overlap_ws.fill_(0)
        self.kernel_kwargs: List[Dict[str, Any]] = [
            {"workspace_buffer": torch.empty(nbytes, dtype=torch.uint8, device=cfg.device)},  # expect: FC105
            {"workspace_buffer": overlap_ws},
        ]
        self.stream_idx = 0

    def prepare(self, meta: DecodeMeta) -> DecodeMeta:
        """Per step, instead of a plan: size this stream's scratch and the kernel's max_seq_len."""
        need = meta["block_tables"].shape[0] * self.cfg.num_qo_heads * self.cfg.head_dim * 64
        if need > self.kernel_kwargs[self.stream_idx]["workspace_buffer"].numel():
            self.kernel_kwargs[self.stream_idx]["workspace_buffer"] = torch.zeros(need, dtype=torch.uint8, device=self.cfg.device)  # expect: FC107
        meta["max_seq_len"] = int(meta["seq_lens"].max())  # expect: FC101
        return meta

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        assert meta["block_tables"].dtype == torch.int32, "trtllm-gen wants int32 block tables"  # expect: FC109
        kwargs = self.kernel_kwargs[self.stream_idx] | {"block_tables": meta["block_tables"], "seq_lens": meta["seq_lens"]}
        return trtllm_batch_decode_with_kv_cache(query=q, kv_cache=kv_cache, max_seq_len=meta["max_seq_len"], **kwargs)
