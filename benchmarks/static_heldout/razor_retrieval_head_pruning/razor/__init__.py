"""RazorAttention-style KV compression: retrieval heads keep everything, the rest keep sink + window."""

from razor.config import RazorConfig
from razor.heads import HeadRouter, HeadScores, calibrate_head_scores
from razor.pages import CompressedPageTable, RazorBatch, compressed_page_table, window_start

__all__ = [
    "CompressedPageTable", "HeadRouter", "HeadScores", "RazorBatch", "RazorConfig",
    "calibrate_head_scores", "compressed_page_table", "window_start",
]
