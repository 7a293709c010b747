"""Out of GPU memory: the error a run raises, and giving the memory back afterwards.

Its own module below `lifecycle` and `evaluate` (both raise it; `lifecycle` imports `evaluate`).
"""

from __future__ import annotations

import traceback

import torch


class OutOfMemory(RuntimeError):
    """The run did not fit in GPU memory; the message names the settings to lower (training's or
    evaluation's, by where it ran out)."""


def free_gpu_memory(err: BaseException | None = None) -> None:
    """Give the GPU memory of a failed run back to the driver (CUDA's cache), for a process that goes on.

    Call it where the exception ends its life (after the except block): until then its traceback
    holds the failed frames and their tensors. With `err` (an exception still to be raised on,
    e.g. to a notebook), the locals of the finished frames its tracebacks hold are cleared first
    (the traceback still prints, without them).
    """
    import gc

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)  # frames still executing (the caller's) are left alone
        err = err.__cause__ or err.__context__
    gc.collect()  # the frames and tensors in reference cycles
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
