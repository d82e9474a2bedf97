"""Mean pooling over ragged segments of the hidden states."""
import torch
import triton
import triton.language as tl


@triton.jit
def segment_mean_kernel(h_ptr, cu_ptr, out_ptr, hidden: tl.constexpr, BLOCK: tl.constexpr):
    assert BLOCK % 16 == 0  # ok: FC109
    seg = tl.program_id(0)
    start = tl.load(cu_ptr + seg)
    end = tl.load(cu_ptr + seg + 1)
    cols = tl.arange(0, BLOCK)
    for c in range(0, hidden, BLOCK):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in range(start, end):
            acc += tl.load(h_ptr + r * hidden + c + cols, mask=c + cols < hidden, other=0.0).to(tl.float32)
        acc = acc / (end - start).to(tl.float32)
        tl.store(out_ptr + seg * hidden + c + cols, acc, mask=c + cols < hidden)


def segment_mean(hidden: torch.Tensor, cu_seqlens: torch.Tensor, num_segments: int) -> torch.Tensor:
    out = torch.empty(num_segments, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    segment_mean_kernel[(num_segments,)](hidden, cu_seqlens, out, hidden.shape[1], BLOCK=128)
    return out
