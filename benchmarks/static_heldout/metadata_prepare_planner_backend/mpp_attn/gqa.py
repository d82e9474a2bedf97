"""GQA decode backend: an eager wrapper planned by `prepare_metadata_for_decode`, graph buckets by
`prepare_metadata_for_replay`; `setup_metadata` and `warmup_meta_once` plan once at start-up."""
import itertools
from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mpp import DUMMY_PAGE, BackendConfig, ForwardInput
from mpp_attn.workspace import decode_workspace


class GqaDecodeBackend:
    def __init__(self, cfg: BackendConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._plan_info: Dict[int, int] = {}
        self._setup_done = False
        self.decode_workspace = decode_workspace(cfg, device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, "NHD", use_tensor_cores=cfg.use_tensor_cores
        )
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ---- one-time set-up --------------------------------------------------------------------
    def setup_metadata(self, free_page_mask: torch.Tensor) -> None:
        """Allocate the eager buffers and plan a one-row batch so the planner's JIT runs before serving."""
        cfg, dev = self.cfg, self.device
        free_pages = free_page_mask.sum().item()  # ok: FC101
        if free_pages < cfg.max_batch_size:
            raise RuntimeError(f"KV pool has {free_pages} free pages, fewer than max_batch_size={cfg.max_batch_size}")
        self.kv_indices_dev = torch.empty(cfg.max_pages, dtype=torch.int32, device=dev)  # ok: FC107
        self.last_page_len_dev = torch.ones(cfg.max_batch_size, dtype=torch.int32, device=dev)
        self.out_loc_buf = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=dev)
        self.kv_indices_dev[:1].fill_(DUMMY_PAGE)
        self.decode_wrapper.plan(
            torch.tensor([0, 1], dtype=torch.int32),
            self.kv_indices_dev[:1],
            torch.ones(1, dtype=torch.int32),
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        self._setup_done = True

    def init_graph_wrappers(self) -> None:
        cfg, dev = self.cfg, self.device
        max_bs = max(cfg.graph_buckets)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=dev)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=cfg.use_tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.kv_indices_buf.fill_(DUMMY_PAGE)  # ok: FC104

    def warmup_meta_once(self) -> None:
        """Plan every bucket once with one-page rows, so the first real replay does not pay for it."""
        cfg = self.cfg
        for w in itertools.chain(self.graph_wrappers.values(), [self.decode_wrapper]):
            if w._use_tensor_cores != cfg.use_tensor_cores:  # expect: FC103
                raise RuntimeError("wrapper built with the wrong tensor-core setting")
        for bs, w in self.graph_wrappers.items():
            w.plan(
                torch.arange(bs + 1, dtype=torch.int32),
                self.kv_indices_buf[:bs],
                torch.ones(bs, dtype=torch.int32),
                cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
            )
        torch.cuda.synchronize()  # ok: FC101

    # ---- per step ---------------------------------------------------------------------------
    def prepare_metadata_for_decode(self, fwd: ForwardInput) -> None:
        cfg = self.cfg
        self._require_setup()
        bs, n = fwd.batch_size, fwd.num_pages
        if int(fwd.seq_lens_stage.max()) > cfg.max_context_len:  # ok: FC101
            raise ValueError("a request outgrew max_context_len")
        self.kv_indices_dev[:n].copy_(fwd.kv_indices)
        last = self.last_page_len_dev[:bs]
        torch.remainder(fwd.seq_lens - 1, cfg.page_size, out=last)
        last.add_(1)
        self.decode_wrapper.plan(  # expect: FC102
            fwd.kv_indptr_stage, self.kv_indices_dev[:n], last,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        self.out_loc_buf[:bs].copy_(fwd.out_cache_loc)

    def prepare_metadata_for_replay(self, fwd: ForwardInput, bucket: int) -> None:
        cfg = self.cfg
        bs, n = fwd.batch_size, fwd.num_pages
        pad = bucket - bs
        self.kv_indptr_pinned[: bs + 1].copy_(fwd.kv_indptr_stage)
        self.kv_indptr_pinned[bs + 1 : bucket + 1] = n + torch.arange(1, pad + 1, dtype=torch.int32)
        self.last_page_len_pinned[:bs].copy_(fwd.last_page_len_stage)
        self.last_page_len_pinned[bs:bucket] = 1
        self.kv_indices_buf[:n].copy_(fwd.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bucket].plan(  # ok: FC102
            self.kv_indptr_pinned[: bucket + 1], self.kv_indices_buf[: n + pad], self.last_page_len_pinned[:bucket],
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        # padded rows read one page each: point them at the dummy page
        self.kv_indices_buf[n : n + pad].fill_(DUMMY_PAGE)  # expect: FC104
        self.out_loc_buf[:bs].copy_(fwd.out_cache_loc)  # ok: FC104
        self._plan_info[bucket] = bs  # ok: FC103

    def _require_setup(self) -> None:
        assert self._setup_done, "setup_metadata() must run before serving"  # ok: FC109

    # ---- in the step ------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.cfg.num_heads * self.cfg.head_dim

    @property
    def kv_dim(self) -> int:
        return 2 * self.cfg.num_kv_heads * self.cfg.head_dim

    @property
    def out_dim(self) -> int:
        return self.q_dim

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self._run(q.view(-1, self.cfg.num_heads, self.cfg.head_dim), kv_cache, bs)

    def store_kv(self, kv: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> None:
        cfg = self.cfg
        k, v = kv.view(-1, 2, cfg.num_kv_heads, cfg.head_dim).unbind(1)
        loc = self.out_loc_buf[:bs]
        page, slot = loc // cfg.page_size, loc % cfg.page_size
        kv_cache[page, 0, slot] = k  # NHD: [num_pages, 2, page_size, kv_heads, head_dim]
        kv_cache[page, 1, slot] = v

    def _run(self, q: torch.Tensor, cache: torch.Tensor, bs: int) -> torch.Tensor:
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.decode_wrapper
        return w.run(q, cache)  # ok: FC108

    # ---- debugging --------------------------------------------------------------------------
    def meta_summary(self) -> List[str]:
        lines = [f"buckets planned: {sorted(self._plan_info)}"]
        for bs in sorted(self._plan_info):
            top = self.kv_indptr_buf[bs].item()  # ok: FC101
            lines.append(f"bucket {bs}: {top} pages")
        return lines
