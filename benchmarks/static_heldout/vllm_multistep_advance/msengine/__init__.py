"""Multi-step scheduling: the scheduler hands the worker one batch and the worker runs ``num_steps``
decode steps back to back, advancing inputs and the paged-KV metadata on the GPU between steps."""
