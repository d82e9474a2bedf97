"""Ulysses (DeepSpeed-style) sequence-parallel serving: prompts are sharded over the SP ranks
by tokens, attention runs on a head shard of the full sequence after an all-to-all."""

__version__ = "0.3.0"
