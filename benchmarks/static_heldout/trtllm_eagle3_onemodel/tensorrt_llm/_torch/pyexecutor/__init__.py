"""Executor: model engine, CUDA graph runner, resource managers."""
