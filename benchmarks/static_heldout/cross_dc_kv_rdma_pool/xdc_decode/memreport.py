"""Memory accounting for the decode cluster's dashboards."""
from typing import Dict

from xdc_decode.attention import MlaDecodeAttention

_WS_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


def workspace_report(attn: MlaDecodeAttention) -> Dict[str, int]:
    report: Dict[str, int] = {}
    for bs, wrapper in attn.graph_mla.items():
        for field_name in _WS_FIELDS:
            buf = getattr(wrapper, field_name)  # expect: FC103
            report[f"graph[{bs}]{field_name}"] = buf.numel() * buf.element_size()
    report["tail"] = attn.tail_workspace.numel()
    return report
