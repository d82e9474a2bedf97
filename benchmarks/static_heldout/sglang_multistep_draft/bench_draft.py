import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


def main():
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    return w


if __name__ == "__main__":
    main()
