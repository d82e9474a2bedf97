from .registry import AttnAtoms, ConfigBundle, DSAttentionRegistry, DSSelfAttentionBase, DSSelfAttentionConfig
from . import flashinfer_blocked  # noqa: F401  (registers its module class)
