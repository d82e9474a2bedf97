from .sequence_descriptor import BlockedAllocator, DSSequenceDescriptor
from .ragged_wrapper import RaggedBatchWrapper, RaggedView
