"""mcmb: attention metadata builders composed from mixins, picked by attention type."""
from mcmb.batches import AttnMetadata, DecodeBatch, MixedBatch, PrefillBatch
from mcmb.config import BuilderConfig

__all__ = ["AttnMetadata", "BuilderConfig", "DecodeBatch", "MixedBatch", "PrefillBatch"]
