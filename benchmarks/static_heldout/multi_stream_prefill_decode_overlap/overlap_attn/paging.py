from typing import List


def pages_per_request(kv_lens, page_size: int) -> List[int]:
    return [(int(n) + page_size - 1) // page_size for n in kv_lens]  # expect: FC101
