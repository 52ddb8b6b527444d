"""One writer thread and one sampler thread: every sampled row is a whole transition."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from replaystore.transitions import ReplayBuffer

CONST = 3.0


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_concurrent_writer_and_sampler_see_consistent_rows(storage_kind: str, sampler: str) -> None:
    buf = ReplayBuffer("cpu", "cpu", 512, storage=storage_kind, sampler=sampler, seed=0)
    buf.add({"obs": np.zeros(64, np.float32), "action": 0})
    stop = threading.Event()
    errors: list[BaseException] = []
    sampled = [0]

    def writer() -> None:
        i = 1
        try:
            while not stop.is_set():
                if i % 7 == 0:  # batches that wrap around the ring
                    ids = np.arange(i, i + 100)
                    obs = np.repeat((ids * CONST).astype(np.float32)[:, None], 64, axis=1)
                    buf.add_batch({"obs": obs, "action": ids})
                    i += 100
                else:
                    buf.add({"obs": np.full(64, i * CONST, np.float32), "action": i})
                    i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def sampler_loop() -> None:
        try:
            for _ in range(1500):
                out = buf.sample_batch(64)
                # obs = float32(id * CONST), computed in float64 as the writer does:
                # exact for every id (float32(id) * CONST is not once ids pass 2**24,
                # which a fast writer reaches within the 1500 samples).
                expected = (out["action"].to(torch.float64)[:, None] * CONST).to(torch.float32)
                if not torch.equal(out["obs"], expected.expand(-1, 64)):
                    raise AssertionError("a sampled row mixes two transitions")
                if sampler == "prioritized":
                    buf.update_priorities(out["index"], torch.rand(64))
                sampled[0] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler_loop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    buf.close()
    assert not errors, errors[0]
    assert sampled[0] == 1500
