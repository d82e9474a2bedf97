"""Host-side 3-D (temporal, height, width) rotary positions in the style of Qwen2-VL's get_rope_index."""
import numpy as np


def video_block_positions(start, grid_t, grid_h, grid_w, second_per_grid, tokens_per_second):
    t = (np.arange(grid_t) * second_per_grid * tokens_per_second).astype(np.int64)
    tt = np.repeat(t, grid_h * grid_w)
    hh = np.tile(np.repeat(np.arange(grid_h), grid_w), grid_t)
    ww = np.tile(np.arange(grid_w), grid_t * grid_h)
    return np.stack([tt, hh, ww]) + start


def build_positions(input_ids, video_token_id, video_grid_thw, second_per_grid, spatial_merge=2, tokens_per_second=2):
    """Positions (3, L) for one request and the rope delta its decode steps add to the sequence length."""
    assert video_grid_thw.shape[1] == 3  # expect: FC109
    pos = np.empty((3, len(input_ids)), dtype=np.int64)
    cursor, nxt, vid = 0, 0, 0
    video_starts = np.flatnonzero(np.asarray(input_ids) == video_token_id)
    while cursor < len(input_ids):
        if vid < len(video_grid_thw) and len(video_starts) and cursor == video_starts[0]:
            t, h, w = (int(x) for x in video_grid_thw[vid])
            h, w = h // spatial_merge, w // spatial_merge
            block = video_block_positions(nxt, t, h, w, second_per_grid[vid], tokens_per_second)
            pos[:, cursor : cursor + block.shape[1]] = block
            cursor += block.shape[1]
            nxt = int(block.max()) + 1
            video_starts = video_starts[video_starts >= cursor]
            vid += 1
        else:
            pos[:, cursor] = nxt
            cursor += 1
            nxt += 1
    return pos, nxt - len(input_ids)
