"""Graph transform: replace every SDPA of the exported model with the cached FlashInfer attention op."""

import functools
from typing import Dict, Tuple

import torch
from torch.fx import GraphModule, Node

from auto_deploy.custom_ops.attention_interface import SequenceInfo
from auto_deploy.shim.kv_cache_handler import KVCacheHandler

_SDPA_TARGETS = (torch.ops.aten.scaled_dot_product_attention.default,)
# metadata inputs of the op, in its argument order: SequenceInfo's arrays, aliased as module buffers so that
# the compiled graph (and the graph-mode wrappers planned inside it) read them by address
METADATA_ARGS = (
    "batch_info_host",
    "qo_indptr",
    "qo_indptr_host",
    "cu_num_pages",
    "cu_num_pages_host",
    "cache_loc",
    "page_table",
    "last_page_len",
    "last_page_len_host",
    "seq_len",
)


class InsertCachedAttention:
    """Each SDPA becomes ``auto_deploy::flashinfer_mha_with_cache`` reading caches registered on the module."""

    def __init__(self, seq_info: SequenceInfo, kv_handler: KVCacheHandler):
        if kv_handler._kv_layout != "NHD":  # ok: FC103
            raise ValueError("the inserted op reshapes keys and values for NHD pages only")
        self.seq_info = seq_info
        self.kv_handler = kv_handler
        self.page_size = seq_info.page_size

    def _metadata_attrs(self, gm: GraphModule) -> Dict[str, Node]:
        graph = gm.graph
        last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
        out: Dict[str, Node] = {}
        with graph.inserting_after(last_input):
            for name in reversed(METADATA_ARGS):
                gm.register_buffer(f"_meta_{name}", getattr(self.seq_info, name), persistent=False)
                out[name] = graph.get_attr(f"_meta_{name}")
        return out

    def apply(self, gm: GraphModule) -> Tuple[GraphModule, int]:
        meta = self._metadata_attrs(gm)
        num_replaced = 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _SDPA_TARGETS:
                continue
            q, k, v = node.args[:3]
            scale = node.kwargs.get("scale")
            if isinstance(scale, torch.Tensor):
                # exported scales can be 0-d tensors; the op takes a Python float
                scale = scale.item()  # ok: FC101
            head_dim = q.meta["val"].shape[-1]
            kv_heads = k.meta["val"].shape[1]
            k_name, v_name = f"k_cache_{num_replaced}", f"v_cache_{num_replaced}"
            for name in (k_name, v_name):
                self.kv_handler.register_cache(name, functools.partial(self.kv_handler.new_cache, kv_heads, head_dim))
            with gm.graph.inserting_before(node):
                # [b, h, s, d] -> [tokens, h * d]
                q_flat = gm.graph.call_method("reshape", (gm.graph.call_method("transpose", (q, 1, 2)), -1, q.meta["val"].shape[1] * head_dim))
                k_flat = gm.graph.call_method("reshape", (gm.graph.call_method("transpose", (k, 1, 2)), -1, kv_heads * head_dim))
                v_flat = gm.graph.call_method("reshape", (gm.graph.call_method("transpose", (v, 1, 2)), -1, kv_heads * head_dim))
                new = gm.graph.call_function(
                    torch.ops.auto_deploy.flashinfer_mha_with_cache.default,
                    args=(
                        q_flat,
                        k_flat,
                        v_flat,
                        *(meta[name] for name in METADATA_ARGS),
                        gm.graph.get_attr(k_name),
                        gm.graph.get_attr(v_name),
                        scale,
                        head_dim,
                        self.page_size,
                    ),
                )
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            num_replaced += 1
        gm.graph.lint()
        gm.recompile()
        return gm, num_replaced
