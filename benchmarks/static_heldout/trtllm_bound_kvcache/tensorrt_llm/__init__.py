"""TensorRT-LLM (PyTorch flow subset).

``tensorrt_llm.bindings`` is the compiled C++ runtime (pybind11); it is built separately and is not part of this
source tree.
"""
