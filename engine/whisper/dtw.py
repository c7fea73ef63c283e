"""Dynamic time warping and the median filter that word alignment runs on (pure numpy/torch).

`dtw(cost)` finds the monotonic path through a [tokens, frames] cost matrix from the top
left to the bottom right with the least summed cost, each step going down, right or
diagonally. It follows openai-whisper's CPU implementation in what decides the path:
the running cost is stored as float32 after each cell's float64 sum, and a tie between
the three predecessors goes to the one on the left (a step along the frames), unless
the diagonal or the one above is strictly smaller than both others. Word times move by
a frame when a tie is broken differently, so these details must stay as they are.

The cells of one anti-diagonal (i + j constant) depend only on the two diagonals before
it, so each diagonal is one vectorised numpy step: tokens + frames steps in all.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

DIAGONAL, UP, LEFT = 0, 1, 2     # the step that reached a cell: (i-1, j-1), (i-1, j), (i, j-1)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cost [N, M] -> (token indices, frame indices) of the path, in order, both length L."""
    num_rows, num_cols = cost.shape
    total = np.full((num_rows + 1, num_cols + 1), np.inf, dtype=np.float32)
    trace = np.full((num_rows + 1, num_cols + 1), -1, dtype=np.int8)
    total[0, 0] = 0
    cost = cost.astype(np.float64, copy=False)
    for diagonal in range(2, num_rows + num_cols + 1):
        rows = np.arange(max(1, diagonal - num_cols), min(num_rows, diagonal - 1) + 1)
        cols = diagonal - rows
        c0, c1, c2 = total[rows - 1, cols - 1], total[rows - 1, cols], total[rows, cols - 1]
        step = np.where((c0 < c1) & (c0 < c2), DIAGONAL, np.where((c1 < c0) & (c1 < c2), UP, LEFT))
        best = np.choose(step, (c0, c1, c2))
        total[rows, cols] = (cost[rows - 1, cols - 1] + best.astype(np.float64)).astype(np.float32)
        trace[rows, cols] = step
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    trace[0, :] = LEFT
    trace[:, 0] = UP
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == DIAGONAL:
            i, j = i - 1, j - 1
        elif step == UP:
            i -= 1
        elif step == LEFT:
            j -= 1
        else:
            raise ValueError(f"dtw trace has no step at ({i}, {j})")
    path = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return path[:, 0], path[:, 1]


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd `width` along the last dimension of a 3-D
    tensor, its ends reflected; a dimension too short to reflect is left as it is."""
    if width < 1 or width % 2 == 0:
        raise ValueError(f"median filter width must be a positive odd number, got {width}")
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = F.pad(x, (half, half), mode="reflect")
    return padded.unfold(-1, width, 1).sort(dim=-1).values[..., half]
