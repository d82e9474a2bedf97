"""Re-plan only the per-question level of a cascade wrapper.

The document level changes only when a document joins or leaves the batch; planning it
again for every decode step costs a few hundred microseconds on 64-document batches.
"""

from flashinfer import MultiLevelCascadeAttentionWrapper


def _replan_unique_level(self, qo_indptr, kv_indptr, kv_indices, last_page_len, **plan_kwargs):
    level = self._batch_prefill_wrappers[-1]  # expect: FC103
    level.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, **plan_kwargs)


def install() -> None:
    MultiLevelCascadeAttentionWrapper.replan_unique_level = _replan_unique_level
