"""diffserve: a small serving engine for Differential Transformer checkpoints.

Every differential head is a pair of softmax heads: ``softmax(Q1 K1^T) V - lambda * softmax(Q2 K2^T) V``,
followed by a head-wise RMSNorm scaled by ``1 - lambda_init``. The engine keeps one paged KV cache per
branch (``pos`` for Q1/K1, ``neg`` for Q2/K2) that share page ids, so one page table drives both branches.
"""

from diffserve.config import DiffConfig

__all__ = ["DiffConfig"]
__version__ = "0.2.0"
