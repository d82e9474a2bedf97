"""FlashInfer backend driven by tables: per-mode metadata lambdas, per-layer-kind attention callables."""
from __future__ import annotations

import functools
import logging
import operator
from typing import Callable, Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeW
from flashinfer import BatchPrefillWithPagedKVCacheWrapper as PrefillW
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper as RaggedW

from attn.trtllm_gen import TrtllmDraft, TrtllmGenDecode
from hookserve.batch import ForwardBatch, ReplayMeta
from hookserve.config import FIXED_WS_BYTES, GRAPH_WS_MB, PREFILL_WS_BYTES, ServeConfig, WsSize

logger = logging.getLogger(__name__)

# Debug probes shown by /debug/attention, one per wrapper field of interest.
WRAPPER_PROBES = {
    "plan_info": lambda w: w._plan_info,  # expect: FC103
    "float_workspace": lambda w: w._float_workspace_buffer,  # expect: FC103
}


def make_windowed_attend(wrapper: DecodeW) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def attend(q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q, kv_cache)  # expect: FC108
    return attend


class FlashInferHookedBackend:
    def __init__(self, cfg: ServeConfig, device: torch.device, trtllm: TrtllmGenDecode, draft: TrtllmDraft) -> None:
        self.cfg, self.device, self.trtllm, self.draft = cfg, device, trtllm, draft
        self._kv_layout = "NHD"  # ok: FC103
        self._require_layout(self._kv_layout)
        max_bs = cfg.max_batch_size
        self.workspace = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.empty(GRAPH_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        window_ws = torch.empty(FIXED_WS_BYTES["window"](), dtype=torch.uint8, device=device)  # expect: FC106
        softcap_ws = torch.empty(WsSize.SOFTCAP, dtype=torch.uint8, device=device)  # expect: FC106
        ragged_ws = torch.empty(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        local_ws = torch.empty(cfg.max_num_tokens * cfg.num_qo_heads * 256, dtype=torch.uint8, device=device)  # ok: FC106
        extend_ws = torch.empty(cfg.extend_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_wrappers = {
            "decode": DecodeW(self.workspace, "NHD"), "window": DecodeW(window_ws, "NHD"),
            "softcap": DecodeW(softcap_ws, "NHD"), "local": PrefillW(local_ws, "NHD"),
        }
        self.extend_wrapper, self.ragged_wrapper = PrefillW(extend_ws, "NHD"), RaggedW(ragged_ws, "NHD")
        self.graph_wrappers: Dict[int, DecodeW] = {}
        # Graph-bound inputs (slices of these go to every bucket's wrapper) and their pinned mirrors.
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.eager_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.replans = 0  # bumped by the plan probe hook
        self._meta_table: Dict[str, Callable[[ForwardBatch], None]] = {
            "decode": lambda fb: self._init_decode(fb),
            "extend": lambda fb: self._init_extend(fb),
            "verify": lambda fb: self.extend_wrapper.plan(fb.qo_indptr_cpu, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len, *cfg.plan_dims()),  # expect: FC102
            "draft": lambda fb: self.draft.plan(fb) if int(fb.seq_lens.max()) < cfg.max_seq_len else None,  # expect: FC101
        }
        self._run_table: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
            "full": lambda q, kv: self._graph_or_eager(q.shape[0]).run(q, kv),  # ok: FC108
            "window": make_windowed_attend(self.eager_wrappers["window"]),
            "softcap": lambda q, kv: self.eager_wrappers["softcap"].run(q, kv),  # expect: FC108
            "local": self.attend_local,
            "trtllm": trtllm,
        }
        self._maintenance: Dict[str, Callable[[], object]] = {
            "reset_graph_pages": lambda: self.kv_indices.zero_(),  # expect: FC104
            "reset_eager_indptr": lambda: self.eager_indptr.zero_(),  # ok: FC104
            "reset_trtllm_tail": lambda: self.trtllm.last_page.fill_(1),  # expect: FC104
        }

    @staticmethod
    def _require_layout(layout: str) -> None:
        assert layout in ("NHD", "HND"), f"unsupported KV layout {layout}"  # ok: FC109

    def _graph_or_eager(self, bs: int) -> DecodeW:
        return self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_wrappers["decode"]

    def _plan_eager(self, kind: str, fb: ForwardBatch, **extra) -> None:
        self.eager_wrappers[kind].plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len, *self.cfg.plan_dims(), **extra)  # expect: FC102
    plan_decode = functools.partialmethod(_plan_eager, "decode")
    plan_window = functools.partialmethod(_plan_eager, "window")
    plan_softcap = functools.partialmethod(_plan_eager, "softcap")

    def _attend_eager(self, kind: str, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager_wrappers[kind].run(q, kv_cache)  # expect: FC108
    attend_local = functools.partialmethod(_attend_eager, "local")

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self._meta_table[fb.mode](fb)

    def _init_decode(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        self.plan_decode(fb)
        self.plan_window(fb, window_left=cfg.sliding_window - 1)
        self.plan_softcap(fb, logits_soft_cap=cfg.logits_soft_cap)
        qo_indptr_cpu = torch.arange(fb.batch_size + 1, dtype=torch.int32)
        self.eager_wrappers["local"].plan(  # ok: FC102
            qo_indptr_cpu, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *cfg.plan_dims(), causal=True)
        self.eager_indptr[: fb.batch_size + 1].copy_(fb.kv_indptr_cpu, non_blocking=True)  # ok: FC104

    def _init_extend(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        self.qo_indptr = torch.zeros(fb.batch_size + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.cumsum(fb.extend_lens, 0, out=self.qo_indptr[1:])
        self.extend_wrapper.plan(  # expect: FC102
            self.qo_indptr, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *cfg.plan_dims(), causal=True)
        self.ragged_wrapper.plan(  # ok: FC102
            fb.qo_indptr_cpu, fb.qo_indptr_cpu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        """Bind bucket ``bs``'s graph-mode wrapper to slices of the shared buffers and plan dummy requests."""
        self.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        self.graph_wrappers[bs] = w = DecodeW(
            self.graph_workspace, self._kv_layout, use_cuda_graph=True,  # ok: FC103
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        w.plan(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], *self.cfg.plan_dims())  # expect: FC102

    def plan_bucket(self, meta: ReplayMeta) -> None:
        # Pre-replay hook: stage bucket ``meta.bs``'s page table and plan its graph-mode wrapper.
        bs, fb = meta.bs, meta.batch
        n, num_pages = fb.batch_size, fb.num_pages
        if num_pages > self.kv_indices.numel():
            self.kv_indices = torch.empty(2 * num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indices[:num_pages].copy_(fb.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1].copy_(fb.kv_indptr_cpu)  # ok: FC101
        self.kv_indptr_cpu[n + 1 : bs + 1] = num_pages
        self.kv_last_page_cpu[:n].copy_(fb.kv_last_page_len_cpu)
        self.seq_lens_host[:n].copy_(fb.seq_lens)  # expect: FC101
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_cpu[:bs], *self.cfg.plan_dims())
        self.kv_indptr[n + 1 : bs + 1] = self.kv_indptr[n]  # expect: FC104

    def make_plan_probe(self) -> Callable[[ReplayMeta, torch.Tensor], None]:  # post-replay: count re-plans per bucket
        last: Dict[int, object] = {}

        def probe(meta: ReplayMeta, logits: torch.Tensor) -> None:
            info = self.graph_wrappers[meta.bs]._plan_info  # expect: FC103
            if last.get(meta.bs) is not info:
                self.replans, last[meta.bs] = self.replans + 1, info
                logger.info(f"bucket {meta.bs} re-planned for lengths {meta.batch.seq_lens}")  # expect: FC101
        return probe

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, kind: str) -> torch.Tensor:
        return self._run_table[kind](q, kv_cache)

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.extend_wrapper.run(q, kv_cache)  # ok: FC108

    def reference_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:  # graph-vs-eager checks
        return self.eager_wrappers["decode"].run(q, kv_cache)  # ok: FC108

    def warmup(self) -> None:
        cfg, plan = self.cfg, self.eager_wrappers["decode"].plan
        plan(torch.arange(2, dtype=torch.int32, device=self.device), self.kv_indices[:1], self.kv_last_page_cpu[:1], *cfg.plan_dims())  # expect: FC102
        plan(torch.arange(2, dtype=torch.int32), self.kv_indices[:1], self.kv_last_page_cpu[:1], *cfg.plan_dims())  # ok: FC102
        kwargs = dict(indptr=self.kv_indptr_cpu[:2], indices=self.kv_indices[:1], last_page_len=self.kv_last_page_cpu[:1])
        self.eager_wrappers["softcap"].plan(**kwargs, num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads,  # ok: FC102
                                            head_dim=cfg.head_dim, page_size=cfg.page_size, logits_soft_cap=cfg.logits_soft_cap)

    def maintain(self, task: str) -> None:
        self._maintenance[task]()

    def debug_state(self) -> Dict[str, object]:
        report: Dict[str, object] = {k: {n: p(w) for n, p in WRAPPER_PROBES.items()} for k, w in self.eager_wrappers.items()}
        report["int_ws"] = sum(t.numel() for t in map(operator.attrgetter("_int_workspace_buffer"), self.graph_wrappers.values()))  # expect: FC103
        report["graph_indptr"] = [vars(w).get("_paged_kv_indptr_buf") for w in self.graph_wrappers.values()]  # expect: FC103
        report["indptr_tail"] = self.kv_indptr[-1].item()  # ok: FC101
        return report
