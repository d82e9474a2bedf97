"""Replays a captured bucket: static inputs sliced per bucket, padding rows, the shared outputs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Tuple

import torch

from gcap.buckets import pad_to_bucket
from gcap.config import GraphConfig
from gcap.static_io import StaticIO
from gcap_attn.backend import GraphAttnBackend
from gcap_run.capturer import CapturedBucket

if TYPE_CHECKING:
    from gcap_run.engine import StepBatch

logger = logging.getLogger(__name__)


class BucketReplayer:
    def __init__(
        self,
        graphs: Dict[Tuple[str, int], CapturedBucket],
        backend: GraphAttnBackend,
        io: StaticIO,
        cfg: GraphConfig,
        copy_stream: torch.cuda.Stream,
    ) -> None:
        self.graphs = graphs
        self.backend = backend
        self.io = io
        self.cfg = cfg
        self.copy_stream = copy_stream
        self.buckets = sorted({bs for _, bs in graphs})
        # what each bucket was last replayed with: (live rows, verify?)
        self._plan_info: Dict[int, Tuple[int, bool]] = {}
        self._row_ids = torch.arange(cfg.max_bs, device=io.device)
        self._pad_steps = torch.arange(1, cfg.max_bs + 1, dtype=torch.int32, device=io.device)

    def bucket_for(self, bs: int) -> int:
        return pad_to_bucket(bs, self.buckets)

    def prepare_inputs(self, bs: int, padded: int, batch: "StepBatch") -> torch.Tensor:
        """Copy the step's inputs into the static prefix; returns each token's row for the sampler."""
        nt = batch.num_tokens
        io = self.io
        io.input_ids[:nt].copy_(batch.input_ids, non_blocking=True)
        io.positions[:nt].copy_(batch.positions, non_blocking=True)
        io.out_loc[:nt].copy_(batch.out_loc, non_blocking=True)
        io.seq_lens[:bs].copy_(batch.meta.seq_lens, non_blocking=True)
        io.seq_lens[bs:padded].fill_(1)
        return torch.repeat_interleave(self._row_ids[:bs], batch.q_lens, output_size=nt)  # ok: FC101

    def pad_rows(self, bs: int, padded: int) -> None:
        """Rows past the live batch replay a one-token sequence on the null page."""
        if padded == bs:
            return
        io = self.io
        io.input_ids[bs:padded].zero_()  # ok: FC104
        io.out_loc[bs:padded].zero_()
        io.kv_indptr[bs + 1 : padded + 1] = io.kv_indptr[bs : bs + 1] + self._pad_steps[: padded - bs]  # expect: FC104

    def replay(self, kind: str, bs: int, padded: int) -> torch.Tensor:
        entry = self.graphs[(kind, padded)]
        if kind == "decode":
            w = self.backend.graph_decode[padded]
            if w._fixed_batch_size != padded:  # expect: FC103
                raise RuntimeError(f"bucket {padded} wrapper was built for another batch size")
        prev = self._plan_info.get(padded)  # ok: FC103
        if prev is not None and prev[1] != (kind == "verify"):
            logger.debug("bucket %d switches between decode and verify", padded)
        self._plan_info[padded] = (bs, kind == "verify")
        torch.cuda.current_stream().wait_stream(self.copy_stream)  # ok: FC101
        entry.graph.replay()
        # the sampler reads the logits on its own stream while the next step's replay may already run
        entry.logits = entry.logits.clone()  # expect: FC107
        rows = bs if kind == "decode" else bs * self.cfg.verify_len
        return entry.logits[:rows]

    def replay_debug_dump(self) -> Dict[int, list]:
        """Operator endpoint: the shared indptr as each bucket would read it now."""
        return {bs: self.io.kv_indptr[: bs + 1].tolist() for bs in self.buckets}  # ok: FC101
