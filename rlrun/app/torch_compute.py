"""The torch settings a run makes in the learner's process: threads, float32 matmul precision, the
hand-derived updates' product backend, and denormal floats flushed to zero."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from rlrun.config.schemas import RunConfig
from rlrun.models import gemm


def flush_denormals() -> None:
    """Flush denormal floats (below 1.2e-38) to zero in this thread and in the torch threads started
    after it (a new thread inherits its creator's setting; threads already started keep theirs), as
    TensorFlow does on CPUs by default. Adam's moment estimates of dead ReLU units decay into
    denormals, which CPUs compute ~100x slower: 40 % of the 256x256 layer's first moments at the end
    of a ``dqn_cartpole`` run, and Adam's step took 330 us instead of 72 (experiments/dqn_learner)."""
    torch.set_flush_denormal(True)


def _within_thread_limit(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``torch_threads`` at most ``OMP_NUM_THREADS`` where the environment sets it: the
    threads a batch scheduler gave the process, or Ray's count of the CPUs a Ray launcher job or a Tune
    trial holds (Ray sets it in its workers). Two learners on two threads each sharing two cores took
    4.3x as long as one alone, at the median (experiments/omp_wait_policy). The run records the count it
    ran with (its config, the ``rlrun.torch_threads`` tag), so a rerun repeats it; one line says so."""
    limit = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not limit.isdigit() or not 0 < int(limit) < cfg.torch_threads:
        return cfg
    print(f"rlrun: torch_threads {cfg.torch_threads} -> {limit}, as OMP_NUM_THREADS={limit} in the environment "
          "(the CPUs this process was given)", flush=True)
    return replace(cfg, torch_threads=int(limit))


def set_torch_compute(cfg: RunConfig) -> RunConfig:
    """This process's torch threads and float32 precision, as the run's config says (each run sets them:
    a precision never carries over from an earlier run in the same process); returns the config the run
    records, its ``torch_threads`` within ``OMP_NUM_THREADS`` (``_within_thread_limit``). ``medium`` lets
    oneDNN run float32 convolutions in bfloat16 too: torch's setting covers matmuls only, and the Nature
    CNN's conv stack trains 1.37x faster so (fwd + bwd of 256 frames on 2 threads here: 64 -> 47 ms).
    Denormals are flushed (``flush_denormals``) before the thread count is set, so new threads inherit it.
    ``torch_matmul_backend: auto`` is recorded as the backend it chose on this machine and precision
    (``gemm.set_backend``), so a rerun elsewhere computes with the same one."""
    cfg = _within_thread_limit(cfg)
    flush_denormals()
    torch.set_num_threads(cfg.torch_threads)
    torch.set_float32_matmul_precision(cfg.torch_matmul_precision)
    mkldnn: Any = torch.backends.mkldnn  # its per-operation precision settings are not in torch's stubs
    mkldnn.conv.fp32_precision = "bf16" if cfg.torch_matmul_precision == "medium" else "none"
    return replace(cfg, torch_matmul_backend=gemm.set_backend(cfg.torch_matmul_backend, cfg.torch_matmul_precision))
