"""KV layouts and the page strides that depend on them.

NHD pages are ``[page_size, num_kv_heads, head_dim]``, HND pages ``[num_kv_heads, page_size, head_dim]``;
FlashInfer's wrappers take the layout by name, trtllm-gen decode wants HND.
"""

import enum


class KVLayout(str, enum.Enum):
    NHD = "NHD"
    HND = "HND"


NHD_CODE = 0
HND_CODE = 1

# FlashInfer keeps the graph-mode indices buffer under this name; the graph runner checks it is ours
INDICES_BUF_ATTR = "_paged_kv_indices_buf"


def layout_code(layout: KVLayout) -> int:
    return HND_CODE if layout is KVLayout.HND else NHD_CODE


def page_shape(layout: KVLayout, page_size: int, num_kv_heads: int, head_dim: int) -> tuple:
    if layout is KVLayout.NHD:
        return (page_size, num_kv_heads, head_dim)
    return (num_kv_heads, page_size, head_dim)


def token_strides(layout: KVLayout, page_size: int, num_kv_heads: int, head_dim: int) -> tuple:
    """(token stride, head stride) inside one K or V page, in elements."""
    if layout is KVLayout.NHD:
        return num_kv_heads * head_dim, head_dim
    return head_dim, page_size * head_dim
