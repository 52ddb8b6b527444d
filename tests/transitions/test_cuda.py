"""CUDA storage: the same behaviour with columns on the GPU (skipped without a GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from replaystore.transitions import ReplayBuffer

from .conftest import batch, ids_of, transition

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_storage_keeps_columns_on_the_gpu_and_samples_there() -> None:
    buf = ReplayBuffer("cuda", "cuda", 16, seed=0)
    assert buf.storage_kind == "memory"
    buf.add(transition(0))
    buf.add_batch(batch(range(1, 20)))
    out = buf.sample_batch(32)
    assert out.device.type == "cuda" and out["obs"].device.type == "cuda"
    assert set(ids_of(out).tolist()) <= set(range(4, 20))
    assert ids_of(buf.sample_all(chronological=True)).tolist() == list(range(4, 20))


def test_cuda_storage_can_deliver_batches_to_the_cpu() -> None:
    buf = ReplayBuffer("cpu", "cuda", 8, seed=0)
    buf.add_batch(batch(range(8)))
    out = buf.sample_by_index([1, 2])
    assert out.device == torch.device("cpu") and ids_of(out).tolist() == [1, 2]


def test_cpu_memmap_storage_can_deliver_batches_to_the_gpu() -> None:
    buf = ReplayBuffer("cuda", "cpu", 8, seed=0)
    buf.add_batch(batch(range(8)))
    assert buf.sample_batch(4)["obs"].device.type == "cuda"


def test_cuda_prioritized_sampling_and_checkpoint(tmp_path: Path) -> None:
    src = ReplayBuffer("cuda", "cuda", 8, sampler="prioritized", seed=1)
    src.add_batch({k: torch.as_tensor(v, device="cuda") for k, v in batch(range(10)).items()})
    src.update_priorities(torch.arange(8, device="cuda"), torch.arange(8.0, device="cuda"))
    out = src.sample_batch(16)
    assert out["weight"].device.type == "cuda" and out["index"].device.type == "cuda"
    src.save(tmp_path / "ckpt")
    dst = ReplayBuffer("cuda", "cuda", 8, sampler="prioritized", seed=2)
    dst.load(tmp_path / "ckpt")
    np.testing.assert_array_equal(dst.priorities(), src.priorities())
    a, b = src.sample_batch(16), dst.sample_batch(16)
    assert torch.equal(a["index"], b["index"]) and torch.equal(a["obs"], b["obs"])


def test_memmap_on_cuda_is_refused() -> None:
    with pytest.raises(ValueError, match="memmap"):
        ReplayBuffer("cuda", "cuda", 8, storage="memmap")


def test_cpu_checkpoint_loads_into_a_cuda_buffer(tmp_path: Path) -> None:
    src = ReplayBuffer("cpu", "cpu", 8, storage="memory", seed=1)
    src.add_batch(batch(range(11)))
    src.save(tmp_path / "ckpt")
    dst = ReplayBuffer("cuda", "cuda", 8, seed=2)
    dst.load(tmp_path / "ckpt")  # keeps its own CUDA RNG (logged)
    assert ids_of(dst.sample_all(chronological=True)).tolist() == list(range(3, 11))
