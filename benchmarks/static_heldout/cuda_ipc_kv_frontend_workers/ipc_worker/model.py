import torch
from torch import nn

from ipckv import IpcServeConfig
from ipc_worker.attention import WorkerAttention
from ipc_worker.stager import StagedBatch


class WorkerLayer(nn.Module):
    def __init__(self, cfg: IpcServeConfig, attn: WorkerAttention, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.layer_id = layer_id
        h = cfg.hidden
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.norm = nn.RMSNorm(h)
        self.q_proj = nn.Linear(h, self.q_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, h, bias=False)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.SiLU(), nn.Linear(4 * h, h, bias=False))

    def _q(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.norm(x)).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def _out(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o_proj(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)

    def decode_graph(self, x, kv_cache, bs: int) -> torch.Tensor:
        return self._out(x, self.attn.forward_decode_graph(self._q(x), kv_cache, self.layer_id, bs))

    def decode_eager(self, x, kv_cache) -> torch.Tensor:
        return self._out(x, self.attn.forward_decode_eager(self._q(x), kv_cache))

    def decode_long(self, x, kv_cache, staged: StagedBatch, max_len: int) -> torch.Tensor:
        return self._out(x, self.attn.forward_long(self._q(x), kv_cache, staged, max_len))

    def prefill(self, x, kv_cache, staged: StagedBatch, max_q: int, max_kv: int) -> torch.Tensor:
        return self._out(x, self.attn.forward_prefill(self._q(x), kv_cache, staged, max_q, max_kv))


class WorkerModel(nn.Module):
    def __init__(self, cfg: IpcServeConfig, attn: WorkerAttention, pool_kv: torch.Tensor, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden, device=device)
        self.layers = nn.ModuleList([WorkerLayer(cfg, attn, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden, device=device)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False, device=device)
        self.pool_kv = pool_kv  # [layers, pages, 2, page, heads, dim], opened from the frontend's handle

    def decode_graph(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer.decode_graph(x, self.pool_kv[i], bs)
        return self.lm_head(self.norm(x))

    def decode_eager(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer.decode_eager(x, self.pool_kv[i])
        return self.lm_head(self.norm(x))

    def decode_long(self, staged: StagedBatch, max_len: int) -> torch.Tensor:
        x = self.embed(staged.input_ids)
        for i, layer in enumerate(self.layers):
            x = layer.decode_long(x, self.pool_kv[i], staged, max_len)
        return self.lm_head(self.norm(x))

    def prefill(self, staged: StagedBatch, max_q: int, max_kv: int) -> torch.Tensor:
        x = self.embed(staged.input_ids)
        for i, layer in enumerate(self.layers):
            x = layer.prefill(x, self.pool_kv[i], staged, max_q, max_kv)
        return self.lm_head(self.norm(x))
