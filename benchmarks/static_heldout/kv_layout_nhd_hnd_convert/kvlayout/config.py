from dataclasses import dataclass

# graph workspaces per layout, MiB (HND graphs split longer contexts)
_GRAPH_WS_MIB = {"NHD": 128, "HND": 256}


@dataclass
class ServerConfig:
    max_batch_size: int = 48
    max_seq_len: int = 131072
    page_size: int = 32
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 4096
    vocab_size: int = 32000
    nhd_pages: int = 65536
    hnd_pages: int = 32768
    promote_len: int = 16384
    migrate_pages_per_step: int = 64
    use_trtllm_hnd: bool = True
    graph_batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 48)

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def eager_workspace_bytes(self) -> int:
        chunks = max(1, self.max_seq_len // 2048)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (16 << 20)

    def tail_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * 2 * (self.head_dim + 1) * 4 + (4 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 2) * 4 * 32
