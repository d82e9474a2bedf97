"""The eager decode wrapper: FlashInfer's decode plus a layout tag for the KV dumper."""

from flashinfer import BatchDecodeWithPagedKVCacheWrapper


class EagerDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Decode for batches past the largest captured bucket."""

    def layout_tag(self) -> str:
        return f"decode/{self._kv_layout}"  # expect: FC103
