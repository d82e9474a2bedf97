from dataclasses import dataclass


@dataclass
class ServerArgs:
    num_layers: int = 32
    hidden: int = 4096
    vocab: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_running_requests: int = 256
    max_total_pages: int = 262144
    max_pages_per_seq: int = 8192
    chunked_prefill_size: int = 8192
    long_decode_pages: int = 4096
    disable_cuda_graph: bool = False
