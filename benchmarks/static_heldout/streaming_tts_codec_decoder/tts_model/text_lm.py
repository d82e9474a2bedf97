import torch
from torch import nn

from tts_attn.backends import TextAttention
from ttscore.config import TTSConfig


class TextBlock(nn.Module):
    def __init__(self, cfg: TTSConfig, attn: TextAttention, layer_id: int):
        super().__init__()
        hidden = cfg.text_heads * cfg.head_dim
        self.attn = attn
        self.layer_id = layer_id
        self.heads = cfg.text_heads
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.ff = nn.Sequential(nn.Linear(hidden, 3 * hidden), nn.GELU(), nn.Linear(3 * hidden, hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q(h).view(-1, self.heads, self.head_dim)
        h = h + self.o(self.attn.decode(q, kv_cache[self.layer_id], bs).reshape(h.shape[0], -1))
        return h + self.ff(h)


class TextLM(nn.Module):
    """Backbone: one step per audio frame, its hidden state conditions the depth transformer."""

    def __init__(self, cfg: TTSConfig, attn: TextAttention, vocab: int = 65536):
        super().__init__()
        hidden = cfg.text_heads * cfg.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.audio_embed = nn.Embedding(cfg.codebook_size * cfg.num_codebooks, hidden)
        self.blocks = nn.ModuleList([TextBlock(cfg, attn, i) for i in range(cfg.text_layers)])
        self.norm = nn.LayerNorm(hidden)

    def forward(self, tokens: torch.Tensor, prev_codes: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(tokens) + self.audio_embed(prev_codes).sum(1)
        for blk in self.blocks:
            h = blk(h, kv_cache, bs)
        return self.norm(h)
