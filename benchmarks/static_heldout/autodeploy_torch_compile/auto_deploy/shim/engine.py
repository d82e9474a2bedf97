"""The deploy engine: export, transform, compile, capture, then one step per scheduler iteration."""

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Sequence

import torch
from torch import nn

from auto_deploy.compile.cuda_graph import CapturedGraph
from auto_deploy.custom_ops.attention_interface import PlanParams, SequenceInfo
from auto_deploy.custom_ops.flashinfer_attention import flashinfer_mha_with_cache, get_planner
from auto_deploy.shim.kv_cache_handler import CacheConfig, KVCacheHandler
from auto_deploy.transform.insert_cached_attention import InsertCachedAttention


@dataclass
class Request:
    request_id: int
    new_tokens: List[int]
    pages: List[int]
    num_cached: int
    finished: bool = False


@dataclass
class ADConfig:
    max_seq_len: int
    max_batch_size: int
    max_num_tokens: int
    page_size: int = 64
    cuda_graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    cache: CacheConfig = field(default_factory=CacheConfig)


class ADEngine:
    def __init__(
        self,
        model: nn.Module,
        seq_info: SequenceInfo,
        kv_handler: KVCacheHandler,
        *,
        base_params: PlanParams,
        cuda_graph_batch_sizes: Sequence[int],
        device: torch.device,
    ):
        self.seq_info = seq_info
        self.kv_handler = kv_handler
        self.device = device
        self.planner = get_planner()
        self._base_params = base_params
        self.graph = CapturedGraph(
            model, batch_sizes=cuda_graph_batch_sizes, max_position=seq_info.max_seq_len, device=device
        )
        self._step_hooks: Dict[str, Callable[[int], None]] = {}

    @classmethod
    def build(cls, exported: torch.fx.GraphModule, ad_config: ADConfig, *, model_cfg, device: torch.device) -> "ADEngine":
        seq_info = SequenceInfo(
            max_seq_len=ad_config.max_seq_len,
            max_batch_size=ad_config.max_batch_size,
            page_size=ad_config.page_size,
            max_num_tokens=ad_config.max_num_tokens,
            device=device,
        )
        kv_handler = KVCacheHandler(seq_info, ad_config.cache, device=device)
        gm, num_layers = InsertCachedAttention(seq_info, kv_handler).apply(exported)
        free, _ = torch.cuda.mem_get_info(device)
        num_pages = int(free * ad_config.cache.free_mem_ratio) // kv_handler.bytes_per_page()
        for name, cache in kv_handler.initialize_caches(num_pages).items():
            gm.register_buffer(name, cache, persistent=False)
        kv_handler.initialize_workspaces()
        base_params = PlanParams(
            num_seqs=0,
            n_heads=model_cfg.num_attention_heads,
            n_kv_heads=model_cfg.num_key_value_heads,
            head_dim=model_cfg.head_dim,
            page_size=ad_config.page_size,
            is_generate=True,
            q_dtype=model_cfg.dtype,
            kv_dtype=ad_config.cache.dtype,
        )
        engine = cls(
            gm,
            seq_info,
            kv_handler,
            base_params=base_params,
            cuda_graph_batch_sizes=ad_config.cuda_graph_batch_sizes,
            device=device,
        )
        engine._self_test_attention(model_cfg)
        engine.graph.capture_graph(seq_info.input_ids, seq_info.position_ids, before_capture=engine._prime_graph_bucket)
        engine.planner.graph_bucket = None
        return engine

    def _self_test_attention(self, model_cfg) -> None:
        """Run the inserted op once, eagerly, so that JIT and layout errors surface before serving."""
        si = self.seq_info
        heads, kv_heads, head_dim = model_cfg.num_attention_heads, model_cfg.num_key_value_heads, model_cfg.head_dim
        q = torch.zeros(1, heads * head_dim, dtype=model_cfg.dtype, device=self.device)
        kv = torch.zeros(1, kv_heads * head_dim, dtype=model_cfg.dtype, device=self.device)
        k_cache = self.kv_handler.caches["k_cache_0"]
        v_cache = self.kv_handler.caches["v_cache_0"]
        flashinfer_mha_with_cache(
            q,
            kv,
            kv,
            si.batch_info_host,
            si.qo_indptr,
            si.qo_indptr_host,
            si.cu_num_pages,
            si.cu_num_pages_host,
            si.cache_loc,
            si.page_table,
            si.last_page_len,
            si.last_page_len_host,
            si.seq_len,
            k_cache,
            v_cache,
            None,
            head_dim,
            si.page_size,
        )

    def _prime_graph_bucket(self, bs: int) -> None:
        # from here on the op plans graph-mode wrappers bound to SequenceInfo's arrays for this bucket
        self.planner.reset()
        self.planner.graph_bucket = bs

    def register_step_hook(self, name: str, hook: Callable[[int], None]) -> None:
        self._step_hooks[name] = hook

    def _plan_params(self, num_seqs: int, is_generate: bool) -> PlanParams:
        return self._base_params._replace(num_seqs=num_seqs, is_generate=is_generate)  # ok: FC103

    def prepare_inputs(self, requests: List[Request]) -> int:
        si = self.seq_info
        self.planner.reset()
        si.nest_sequences(
            [r.new_tokens for r in requests],
            page_assignments=[r.pages for r in requests],
            input_pos=[r.num_cached for r in requests],
        )
        n = len(requests)
        if si.is_generate:
            bs = self.graph.bucket_for(n) or n
            self.planner.plan(
                qo_indptr_host=si.qo_indptr_host[: bs + 1],
                kv_page_indptr=si.cu_num_pages[: bs + 1],
                kv_page_indptr_host=si.cu_num_pages_host[: bs + 1],
                kv_page_indices=si.cache_loc,
                kv_last_page_len=si.last_page_len[:bs],
                kv_last_page_len_host=si.last_page_len_host[:bs],
                plan_params=self._plan_params(bs, True),
                for_graph=True,
            )
            # overlap scheduling: get the next step's last-page lengths ready while this one runs
            si.last_page_len[:n].remainder_(si.page_size).add_(1)  # expect: FC104
        return n

    def step(self, requests: List[Request]) -> torch.Tensor:
        self.prepare_inputs(requests)
        total = self.seq_info.num_tokens
        logits = self.graph(self.seq_info.input_ids[:total], self.seq_info.position_ids[:total])
        for hook in self._step_hooks.values():
            hook(total)
        return logits

    def compact(self, moved: Dict[int, int]) -> None:
        self.kv_handler.remap_pages(moved)

    def iter_steps(self, scheduler) -> Iterator[torch.Tensor]:
        while True:
            requests = scheduler.next_batch()
            if not requests:
                return
            yield self.step(requests)
