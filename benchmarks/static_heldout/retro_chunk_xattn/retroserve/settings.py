from dataclasses import dataclass


@dataclass(frozen=True)
class RetroSettings:
    max_batch: int = 128
    max_graph_bs: int = 32
    max_tokens: int = 16384
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 131072
    chunk_size: int = 64
    num_neighbours: int = 2
    neighbour_len: int = 128

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_heads * self.head_dim * 4 * 16 + (32 << 20)

    def neighbour_tokens(self) -> int:
        return self.max_batch * self.num_neighbours * self.neighbour_len
