"""Lookahead decoding without a draft model: drafts are n-gram continuations found in the context."""

from lookahead.config import MAX_DRAFT, NGRAM_N, LookaheadConfig
from lookahead.masks import build_verify_mask
from lookahead.ngram import NgramIndex

__all__ = ["MAX_DRAFT", "NGRAM_N", "LookaheadConfig", "NgramIndex", "build_verify_mask"]
