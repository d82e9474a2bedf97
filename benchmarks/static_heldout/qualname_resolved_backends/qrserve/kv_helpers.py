"""KV-cache helpers, resolved by the runner through ``qrserve.utils.get_kv_helper_cls`` from
``qrserve.config.KV_HELPERS`` (``sys.modules`` first, ``__import__`` otherwise)."""

from __future__ import annotations

import logging

import numpy as np
import torch

logger = logging.getLogger(__name__)


class BlockTable:
    """Per-request page ids: a numpy view of a pinned host table, uploaded to the device table each step."""

    def __init__(
        self,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        page_size: int,
        device: torch.device,
        pin_memory: bool = True,
    ):
        self.page_size = page_size
        self.device = device
        self.pin_memory = pin_memory
        self.block_table = torch.zeros(max_num_reqs, max_num_blocks_per_req, dtype=torch.int32, device=device)
        self.block_table_cpu = torch.zeros(
            max_num_reqs, max_num_blocks_per_req, dtype=torch.int32, device="cpu", pin_memory=pin_memory
        )
        self.block_table_np = self.block_table_cpu.numpy()
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.slot_mapping = torch.zeros(max_num_batched_tokens, dtype=torch.int64, device=device)
        self.slot_mapping_cpu = torch.zeros(max_num_batched_tokens, dtype=torch.int64, device="cpu", pin_memory=pin_memory)
        self.slot_mapping_np = self.slot_mapping_cpu.numpy()

    def ensure_capacity(self, num_reqs: int, num_blocks: int) -> None:
        """Grow the table when a request outgrows the initial number of page columns."""
        rows, cols = self.block_table.shape
        if num_reqs <= rows and num_blocks <= cols:
            return
        new_rows, new_cols = max(rows, num_reqs), max(cols, 2 * num_blocks)
        logger.warning("growing the block table from %dx%d to %dx%d", rows, cols, new_rows, new_cols)
        old_np = self.block_table_np
        self.block_table = torch.zeros(new_rows, new_cols, dtype=torch.int32, device=self.device)  # expect: FC107
        self.block_table_cpu = torch.zeros(new_rows, new_cols, dtype=torch.int32, device="cpu", pin_memory=True)  # ok: FC107
        self.block_table_np = self.block_table_cpu.numpy()
        self.block_table_np[:rows, :cols] = old_np
        num_blocks_per_row = np.zeros(new_rows, dtype=np.int32)
        num_blocks_per_row[:rows] = self.num_blocks_per_row
        self.num_blocks_per_row = num_blocks_per_row

    def append_row(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks_per_row[row])
        self.block_table_np[row, start : start + len(block_ids)] = block_ids
        self.num_blocks_per_row[row] += len(block_ids)

    def clear_row(self, row: int) -> None:
        self.num_blocks_per_row[row] = 0

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> None:
        block_numbers = self.block_table_np[req_indices, positions // self.page_size]
        np.add(
            block_numbers.astype(np.int64) * self.page_size,
            positions % self.page_size,
            out=self.slot_mapping_np[: positions.shape[0]],
        )

    def commit(self, num_reqs: int, num_tokens: int) -> None:
        self.block_table[:num_reqs].copy_(self.block_table_cpu[:num_reqs], non_blocking=True)  # ok: FC101
        self.slot_mapping[:num_tokens].copy_(self.slot_mapping_cpu[:num_tokens], non_blocking=True)


class KVCompactor:
    """Applies the block manager's page moves (defragmentation) to the block table.

    The copies of the moved pages were issued by the block manager; the source pages stay valid until the step
    ends, so the moves are applied after the step's metadata is built and take effect from the next step.
    """

    def __init__(self, block_table: BlockTable, scratch: torch.Tensor, num_pages: int, device: torch.device):
        self._block_table = block_table
        # The decode page-index buffer holds every page of the running batch and is idle once the step is
        # planned; borrow it instead of keeping a second block-table-sized int32 buffer around.
        self._scratch = scratch
        self.num_pages = num_pages
        self.identity = torch.arange(num_pages, dtype=torch.int32, device=device)
        self.moved_pages_total = 0

    def apply(self, moves_np: np.ndarray, src: torch.Tensor, dst: torch.Tensor, num_rows: int) -> None:
        num_moves = int(src.numel())  # ok: FC101
        if num_moves == 0:
            return
        # host mirror
        host_remap = np.arange(self.num_pages, dtype=np.int32)
        host_remap[moves_np[:, 0]] = moves_np[:, 1]
        bt_np = self._block_table.block_table_np
        bt_np[:num_rows] = host_remap[bt_np[:num_rows]]
        # device table, through the borrowed scratch
        remap = self.identity.index_copy(0, src.long(), dst)
        used_cols = int(self._block_table.num_blocks_per_row[:num_rows].max())
        bt = self._block_table.block_table[:num_rows, :used_cols]
        scratch = self._scratch[: bt.numel()]
        torch.index_select(remap, 0, bt.reshape(-1).long(), out=scratch)  # expect: FC104
        bt.copy_(scratch.view_as(bt))  # ok: FC104
        self.moved_pages_total += int((remap != self.identity).sum())  # expect: FC101
