"""ReplayBuffer in distributed training: shards, DistributedSampler, rank-0 logging."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from replaystore.trajectories import ReplayBuffer

from .conftest import TrajectoryFactory


@pytest.fixture
def buffer(trajectory_factory: TrajectoryFactory) -> ReplayBuffer:
    trajs = [trajectory_factory.trajectory(3, success=i % 2 == 0) for i in range(7)]
    return ReplayBuffer(trajs, filter_successful_only=True, shuffle=True, seed=0)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shards_are_disjoint_and_cover_the_buffer(buffer: ReplayBuffer, world_size: int) -> None:
    everything = [buffer[i]["action"] for i in range(len(buffer))]
    shards = [[s["action"] for s in buffer.shard(rank, world_size)] for rank in range(world_size)]
    flat = [a for shard in shards for a in shard]
    assert sorted(flat) == sorted(everything)
    assert len(set(flat)) == len(flat)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize(("rank", "world_size"), [(2, 2), (-1, 2), (0, 0), (0, 1.5)])
def test_bad_shard_arguments_are_rejected(buffer: ReplayBuffer, rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match=r"rank|world_size"):
        buffer.shard(rank, world_size)


def test_distributed_sampler_covers_every_sample_across_ranks(buffer: ReplayBuffer) -> None:
    world_size = 4
    seen: list[int] = []
    for rank in range(world_size):
        sampler = DistributedSampler(buffer, num_replicas=world_size, rank=rank, seed=3)
        sampler.set_epoch(1)
        loader = DataLoader(buffer, sampler=sampler, batch_size=2, collate_fn=list)
        batches = list(loader)
        assert all(isinstance(s["message"], list) for batch in batches for s in batch)
        seen.extend(sampler)
    assert set(seen) == set(range(len(buffer)))
    assert len(seen) == -(-len(buffer) // world_size) * world_size  # padded evenly


def test_only_rank_zero_logs_under_torch_distributed(
    trajectory_factory: TrajectoryFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setenv("RANK", "0")  # the process group wins over the environment
    with caplog.at_level(logging.INFO, logger="replaystore"):
        ReplayBuffer([trajectory_factory.trajectory(2)])
    assert not [r for r in caplog.records if "success rate" in r.message]


def test_buffer_pickles_for_spawned_dataloader_workers(
    trajectory_factory: TrajectoryFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import pickle

    from replaystore.trajectories import TrajectoryStorage

    trajs = [trajectory_factory.trajectory(3) for _ in range(4)]
    storage = TrajectoryStorage(tmp_path_factory.mktemp("store"))
    storage.save_iteration(1, trajs)
    for buffer in (ReplayBuffer(trajs, seed=1), ReplayBuffer.from_storage(storage.root, seed=1)):
        buffer.get_training_samples(2, 2.0, seed=0)  # caches an alias table
        clone = pickle.loads(pickle.dumps(buffer))
        assert [clone[i] for i in range(len(clone))] == [buffer[i] for i in range(len(buffer))]
        assert list(clone.get_training_samples(3, 2.0, seed=4)) == list(
            buffer.get_training_samples(3, 2.0, seed=4)
        )
