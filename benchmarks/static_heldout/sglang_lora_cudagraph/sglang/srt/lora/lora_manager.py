"""Multi-LoRA serving: adapter loading, per-batch segment info, and the buffers CUDA graphs read."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

import torch

from sglang.srt.lora.mem_pool import LoRAAdapter, LoRAMemoryPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

# the shrink/expand kernels tile the rank dimension by this many rows
LORA_RANK_TILE = 16


@dataclass
class LoRAConfig:
    max_loras_per_batch: int = 8
    max_lora_rank: int = 64
    sgmv_workspace_bytes: int = 16 << 20


@dataclass
class LoRABatchInfo:
    bs: int
    seg_lens: torch.Tensor
    seg_indptr: torch.Tensor
    max_len: int
    weight_indices: torch.Tensor
    lora_ranks: torch.Tensor
    scalings: torch.Tensor
    token_slots: Optional[torch.Tensor] = None


class LoRAManager:
    def __init__(
        self,
        lora_config: LoRAConfig,
        *,
        num_layers: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.lora_config = lora_config
        self.max_loras_per_batch = lora_config.max_loras_per_batch
        self.device = device
        self.loras: Dict[str, LoRAAdapter] = {}
        self.memory_pool = LoRAMemoryPool(
            num_layers=num_layers,
            in_features=hidden_size,
            out_features=hidden_size,
            max_loras_per_batch=lora_config.max_loras_per_batch,
            max_lora_rank=lora_config.max_lora_rank,
            dtype=dtype,
            device=device,
        )
        # split-k scratch of the shrink kernel
        self.sgmv_workspace = torch.empty(lora_config.sgmv_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.cuda_graph_batch_info: Optional[LoRABatchInfo] = None
        self.max_bs_in_cuda_graph = 0
        self._batch_info_hooks: Dict[str, Callable[[LoRABatchInfo], None]] = {}

    def register_batch_info_hook(self, name: str, hook: Callable[[LoRABatchInfo], None]) -> None:
        self._batch_info_hooks[name] = hook

    def load_lora_adapter(self, name: str, path: str) -> None:
        assert LORA_RANK_TILE in (8, 16, 32), "unsupported rank tile"  # ok: FC109
        state = torch.load(path, map_location=self.device)
        rank = int(state["r"].item())  # ok: FC101
        if rank > self.lora_config.max_lora_rank:
            raise ValueError(f"adapter {name} has rank {rank} > max_lora_rank={self.lora_config.max_lora_rank}")
        scaling = float(state["alpha"]) / rank
        self.loras[name] = LoRAAdapter(name, rank, scaling, state["weights"])

    def init_cuda_graph_batch_info(self, max_bs: int, attn_backend: "FlashInferAttnBackend") -> None:
        self.max_bs_in_cuda_graph = max_bs
        # Graphs run a fixed number of tokens per request, so the LoRA segments are exactly the attention
        # backend's per-request query offsets: share its buffer instead of keeping a second one in sync.
        self.cuda_graph_batch_info = LoRABatchInfo(
            bs=max_bs,
            seg_lens=torch.ones(max_bs, dtype=torch.int32, device=self.device),
            seg_indptr=attn_backend.cuda_graph_qo_indptr,
            max_len=1,
            weight_indices=torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            lora_ranks=torch.zeros(self.max_loras_per_batch, dtype=torch.int32, device=self.device),
            scalings=torch.zeros(self.max_loras_per_batch, dtype=torch.float32, device=self.device),
        )

    def _write_adapter_info(
        self, lora_paths: List[Optional[str]], weight_indices: torch.Tensor, lora_ranks: torch.Tensor, scalings: torch.Tensor
    ) -> None:
        for i, uid in enumerate(lora_paths):
            slot = self.memory_pool.get_buffer_id(uid)
            weight_indices[i] = slot
            if uid is not None:
                lora_ranks[slot] = self.loras[uid].rank
                scalings[slot] = self.loras[uid].scaling

    def prepare_lora_batch(self, forward_batch: ForwardBatch) -> None:
        cur_uids = set(forward_batch.lora_paths)
        assert len(cur_uids) <= self.max_loras_per_batch, "more adapters than LoRA slots in one batch"  # expect: FC109
        self.memory_pool.prepare_lora_batch(cur_uids, self.loras)
        bs = forward_batch.batch_size

        info = self.cuda_graph_batch_info
        if info is not None and bs <= self.max_bs_in_cuda_graph and forward_batch.forward_mode.is_cuda_graph():
            # in place: the captured graphs read these buffers by address
            self._write_adapter_info(forward_batch.lora_paths, info.weight_indices, info.lora_ranks, info.scalings)
            per_req = forward_batch.spec_num_draft_tokens
            info.seg_lens[:bs].fill_(per_req)
            torch.cumsum(info.seg_lens[:bs], dim=0, out=info.seg_indptr[1 : bs + 1])  # expect: FC104
            info.bs = bs
            info.max_len = per_req
            batch_info = info
        else:
            weight_indices = torch.empty(bs, dtype=torch.int32, device=self.device)
            lora_ranks = torch.zeros(self.max_loras_per_batch, dtype=torch.int32, device=self.device)
            scalings = torch.zeros(self.max_loras_per_batch, dtype=torch.float32, device=self.device)
            self._write_adapter_info(forward_batch.lora_paths, weight_indices, lora_ranks, scalings)
            if forward_batch.forward_mode.is_extend():
                seg_lens = forward_batch.extend_seq_lens
                tokens_per_req = forward_batch.extend_seq_lens_cpu
            else:
                seg_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
                tokens_per_req = [1] * bs
            seg_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            seg_indptr[1:] = torch.cumsum(seg_lens, dim=0)  # ok: FC104
            max_len = int(seg_lens.max())  # expect: FC101
            slots_host = [
                self.memory_pool.get_buffer_id(uid) for uid, n in zip(forward_batch.lora_paths, tokens_per_req) for _ in range(n)
            ]
            batch_info = LoRABatchInfo(
                bs=bs,
                seg_lens=seg_lens,
                seg_indptr=seg_indptr,
                max_len=max_len,
                weight_indices=weight_indices,
                lora_ranks=lora_ranks,
                scalings=scalings,
                token_slots=torch.tensor(slots_host, dtype=torch.int64).to(self.device, non_blocking=True),
            )
        forward_batch.lora_batch_info = batch_info
        for hook in self._batch_info_hooks.values():
            hook(batch_info)
