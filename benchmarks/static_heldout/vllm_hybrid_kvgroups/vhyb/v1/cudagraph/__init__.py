from .wrapper import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper, CudagraphDispatcher, get_forward_context, set_forward_context

__all__ = ["BatchDescriptor", "CUDAGraphMode", "CUDAGraphWrapper", "CudagraphDispatcher", "get_forward_context", "set_forward_context"]
