"""Ascend: torch_npu's fused incremental attention takes sequence lengths as a host list."""
import torch

from xpuserve.platforms import register_backend
from xpuserve.platforms.base import AttentionBackend, StepInput


@register_backend("ascend")
class AscendBackend(AttentionBackend):
    name = "ascend"

    def __init__(self, cfg, device):
        import torch_npu  # noqa: F401  (registers the "npu" device)

        self.cfg = cfg
        self.device = device
        self.block_size = cfg.page_size
        self.kv_caches = [
            torch.zeros((cfg.num_blocks, cfg.page_size, cfg.num_kv_heads * cfg.head_dim), dtype=torch.float16, device=device)
            for _ in range(2 * cfg.num_layers)
        ]
        self.actual_seq_lengths = []
        self.block_table = None

    def begin_step(self, batch: StepInput) -> None:
        self.actual_seq_lengths = batch.seq_lens_cpu.tolist()  # ok: FC101
        self.block_table = torch.from_numpy(batch.block_table_cpu).to(self.device, non_blocking=True)

    def forward_eager(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        import torch_npu

        return torch_npu.npu_incre_flash_attention(
            q, self.kv_caches[2 * layer_id], self.kv_caches[2 * layer_id + 1],
            num_heads=self.cfg.num_qo_heads, num_key_value_heads=self.cfg.num_kv_heads,
            actual_seq_lengths=self.actual_seq_lengths, block_table=self.block_table, block_size=self.block_size,
            input_layout="BSH",
        )
