"""RemoteBuffer: the client matches the local buffer method for method; errors keep their type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.distributed import BatchingWriter, RemoteActorError, RemoteBuffer
from replaystore.errors import (
    ArgumentError,
    BufferIndexError,
    EmptyBufferError,
    PriorityError,
    SchemaError,
)
from replaystore.transitions import ReplayBuffer

pytestmark = pytest.mark.usefixtures("ray_session")


def _transition(i: int) -> dict[str, Any]:
    # The ObjectRL seed's experience: obs, action, reward, next_obs, done.
    return {
        "obs": np.full(4, i, dtype=np.float32),
        "action": np.int64(i % 2),
        "reward": np.float32(1.0),
        "next_obs": np.full(4, i + 1, dtype=np.float32),
        "done": bool(i % 7 == 6),
    }


def _batch(start: int, n: int) -> dict[str, np.ndarray]:
    rows = [_transition(i) for i in range(start, start + n)]
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor) or hasattr(a, "keys"):
        if hasattr(a, "keys"):
            keys = sorted(a.keys())  # iterating a TensorDict yields rows, not keys
            assert keys == sorted(b.keys())
            for key in keys:
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b
        assert type(a) is type(b)


def _both(local: Any, remote: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``name`` on both; same result, or same exception type and message."""
    try:
        expected = getattr(local, name)(*args, **kwargs)
    except Exception as exc:
        with pytest.raises(type(exc)) as info:
            getattr(remote, name)(*args, **kwargs)
        assert type(info.value) is type(exc)
        assert str(info.value) == str(exc)
        return exc
    got = getattr(remote, name)(*args, **kwargs)
    _same(expected, got)
    return got


@pytest.mark.parametrize(
    "sampler", [pytest.param("uniform", marks=pytest.mark.slow), "prioritized"]
)
def test_transitions_client_matches_local_method_for_method(tmp_path: Path, sampler: str) -> None:
    kwargs = {"sampler": sampler, "seed": 5, "storage": "memory"}
    local = ReplayBuffer("cpu", "cpu", 64, **kwargs)
    remote = RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 64, **kwargs)
    try:
        assert type(remote).__name__ == "RemoteReplayBuffer"
        assert remote.add_batch.__doc__ == ReplayBuffer.add_batch.__doc__
        # Errors on an empty buffer: same type and message.
        assert isinstance(_both(local, remote, "sample_batch", 4), EmptyBufferError)
        assert isinstance(_both(local, remote, "sample_by_index", [0]), EmptyBufferError)
        for i in range(5):
            _both(local, remote, "add", _transition(i))
        _both(local, remote, "add_batch", _batch(5, 90))  # wraps the ring
        for prop in ("size", "data_size", "pointer", "buffer_size", "storage_kind", "sampler"):
            assert getattr(remote, prop) == getattr(local, prop), prop
        assert remote.fields == local.fields
        _both(local, remote, "sample_batch", 16)
        _both(local, remote, "sample_random", 3)
        _both(local, remote, "sample_by_index", [0, 3, 3, 63])
        _both(local, remote, "sample_by_index_fields", [1, 2], ["obs", "done"])
        _both(local, remote, "sample_by_index_fields", [1, 2], "obs", as_tuple=True)
        _both(local, remote, "sample_all", chronological=True)
        _both(local, remote, "calculate_num_batches", 10)
        _both(local, remote, "get_next_batch", 10)
        _both(local, remote, "get_next_batch", 10)
        if sampler == "prioritized":
            _both(local, remote, "update_priorities", [1, 2, 3], [0.5, 2.0, 9.0])
            np.testing.assert_array_equal(remote.priorities(), local.priorities())
            remote.beta = local.beta = 0.9
            assert remote.beta == 0.9
            _both(local, remote, "sample_batch", 32)
        # Errors crossing the boundary keep type and message.
        assert isinstance(_both(local, remote, "sample_by_index", [64]), BufferIndexError)
        assert isinstance(_both(local, remote, "sample_batch", 0), ArgumentError)
        assert isinstance(_both(local, remote, "add", {"obs": np.zeros(3)}), SchemaError)
        assert isinstance(_both(local, remote, "sample_by_index_fields", [0], "nope"), SchemaError)
        err = _both(local, remote, "update_priorities", [0], [float("nan")])
        assert isinstance(err, PriorityError)
        # Checkpoints: the remote save loads locally and the other way round.
        remote.save(tmp_path / "r")
        local.save(tmp_path / "l")
        other = ReplayBuffer("cpu", "cpu", 64, **kwargs)
        other.load(tmp_path / "r")
        _same(other.sample_all(), local.sample_all())
        remote.load(tmp_path / "l")
        _both(local, remote, "sample_batch", 8)
        _both(local, remote, "reset")
        assert remote.size == 0
    finally:
        remote.terminate()
        local.close()


def test_n_step_buffer_hosted_remotely_matches_local() -> None:
    """n_step and gamma pass through create(); the samples carry the same n-step entries."""
    kwargs = {"sampler": "uniform", "seed": 9, "storage": "memory", "n_step": 3, "gamma": 0.9}
    local = ReplayBuffer("cpu", "cpu", 32, **kwargs)
    remote = RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 32, **kwargs)
    try:
        _both(local, remote, "add_batch", _batch(0, 40))  # episodes of 7; wraps the ring
        batch = _both(local, remote, "sample_batch", 16)
        assert {"n_step_return", "n_step_next_obs", "n_step_done", "n_step_discount"} <= set(
            batch.keys()
        )
        _both(local, remote, "sample_by_index", [0, 5, 6, 31])
    finally:
        remote.terminate()
        local.close()


@pytest.mark.slow
def test_iterator_methods_are_refused_clearly() -> None:
    remote = RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 8, storage="memory")
    try:
        remote.add_batch(_batch(0, 8))
        with pytest.raises(ArgumentError, match=r"iterator.*get_next_batch"):
            remote.create_epoch_iterator(4)
    finally:
        remote.terminate()


def test_constructor_errors_keep_their_type() -> None:
    with pytest.raises(ArgumentError, match="sampler"):
        RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 8, sampler="nope")
    with pytest.raises(ArgumentError, match="detached"):
        RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 8, detached=True)
    with pytest.raises(ArgumentError, match="dotted path"):
        RemoteBuffer.create("ReplayBuffer")


@pytest.mark.slow
def test_experience_buffer_hosted_remotely_matches_local() -> None:
    from replaystore.experience import DataRow, Experience, ExpMeta
    from replaystore.experience import ReplayBuffer as ExperienceBuffer

    def row(task: str, step: int) -> DataRow:
        meta = ExpMeta(task_id=task, task_name="t", agent_id="a", step=step, execute_time=1.0)
        return DataRow(exp_meta=meta, exp_data=Experience(state={"s": step}, action={"a": 1}))

    rows = [row(t, s) for t in "abc" for s in range(3)]
    local = ExperienceBuffer(seed=2)
    remote = RemoteBuffer.create(ExperienceBuffer, seed=2)
    try:
        _both(local, remote, "store_batch", rows)
        _both(local, remote, "size")
        assert len(remote) == len(local) == 9
        got, want = remote.sample(batch_size=2), local.sample(batch_size=2)
        assert [r.id for r in got] == [r.id for r in want]
        assert isinstance(_both(local, remote, "store", None), SchemaError)
        _both(local, remote, "clear")
        assert remote.size() == 0
    finally:
        remote.terminate()


def test_named_detached_buffer_is_found_by_another_client() -> None:
    remote = RemoteBuffer.create(
        ReplayBuffer, "cpu", "cpu", 32, storage="memory", name="rs-test-named", detached=True
    )
    try:
        remote.add_batch(_batch(0, 10))
        again = RemoteBuffer.connect("rs-test-named")
        assert again.size == 10
        assert type(again) is type(remote)
    finally:
        remote.terminate()
    with pytest.raises(RemoteActorError, match="rs-test-named"):
        again.size  # noqa: B018 - the property makes the remote call


def test_batching_writer_sends_size_batches_and_flushes_on_close() -> None:
    remote = RemoteBuffer.create(ReplayBuffer, "cpu", "cpu", 1000, storage="memory")
    try:
        with BatchingWriter(remote, batch_size=64, max_delay_s=60, max_in_flight=2) as writer:
            for i in range(200):
                writer.add(_transition(i))
            # Three full batches sent (192); 8 pending until close.
            assert writer.sent == 192
        assert remote.size == 200
        obs = remote.sample_all()["obs"][:, 0].numpy()
        np.testing.assert_array_equal(obs, np.arange(200, dtype=np.float32))
        # The time threshold: a tiny delay sends on the next add.
        writer = BatchingWriter(remote, batch_size=10_000, max_delay_s=1e-9)
        writer.add(_transition(0))
        writer.add(_transition(1))
        assert writer.sent >= 1
        writer.close()
        assert remote.size == 202
        with pytest.raises(ArgumentError, match="closed"):
            writer.add(_transition(2))
        # A remote schema error comes back from the send, with its type.
        bad = BatchingWriter(remote, batch_size=1)
        with pytest.raises(SchemaError):
            bad.add({"obs": np.zeros(2, dtype=np.float32)})
            bad.flush()
    finally:
        remote.terminate()


def test_batching_writer_checks_its_arguments() -> None:
    with pytest.raises(ArgumentError, match="batch_size"):
        BatchingWriter(object(), batch_size=0)
    with pytest.raises(ArgumentError, match="max_in_flight"):
        BatchingWriter(object(), max_in_flight=0)
    with pytest.raises(ArgumentError, match="target"):
        BatchingWriter(object())


@pytest.mark.slow
def test_trajectory_storage_and_buffer_hosted_remotely_match_local(tmp_path: Path) -> None:
    from PIL import Image

    from replaystore.errors import TrajectoryError
    from replaystore.trajectories import (
        Action,
        Observation,
        Response,
        Reward,
        Task,
        TrajectoryStorage,
    )
    from replaystore.trajectories import ReplayBuffer as TrajectoryBuffer

    task = Task("Find the hours", "shopping", "stores", "http://shop.localhost", 1, None, "9-5")
    images = []
    for i, color in enumerate(["red", "blue", "red"]):
        Image.new("RGB", (32, 24), color).save(tmp_path / f"s{i}.png")
        images.append(str(tmp_path / f"s{i}.png"))

    prompt = json.dumps([{"role": "user", "content": task.task_name}])

    def trajectory(final: float | None) -> list[dict[str, Any]]:
        return [
            {
                "observation": Observation(task, image, None),
                "action": Action({"key": "click"}, "click [1]"),
                "response": Response("Action: click [1]", None, raw_prompt=prompt),
                "reward": Reward(final if i == 2 else 0.0, None, submit=i == 2),
            }
            for i, image in enumerate(images)
        ]

    trajectories = [trajectory(1.0), trajectory(0.0), trajectory(1.0)]
    local_store = TrajectoryStorage(tmp_path / "local")
    remote_store = RemoteBuffer.create(TrajectoryStorage, tmp_path / "remote")
    local = TrajectoryBuffer(trajectories, filter_successful_only=True, seed=0)
    remote = RemoteBuffer.create(
        TrajectoryBuffer, trajectories, filter_successful_only=True, seed=0
    )
    try:
        local_file = local_store.save_iteration(1, trajectories, rank=0)
        remote_file = remote_store.save_iteration(1, trajectories, rank=0)
        assert Path(remote_file).name == Path(local_file).name
        want, got = local_store.stats(), remote_store.stats()
        assert got["root"] == str(tmp_path / "remote")
        assert {k: v for k, v in got.items() if k != "root"} == {
            k: v for k, v in want.items() if k != "root"
        }
        assert got["total_trajectories"] == 3 and got["successful_trajectories"] == 2
        # A None final reward is refused on the actor with the caller's error type.
        assert isinstance(
            _both(local_store, remote_store, "save_iteration", 2, [trajectory(None)]),
            TrajectoryError,
        )
        assert len(remote) == len(local) == 6
        assert remote.stats.as_dict() == local.stats.as_dict()
        assert remote.validate() == local.validate()
        assert isinstance(_both(local, remote, "get_training_samples", -1), ArgumentError)
    finally:
        remote.terminate()
        remote_store.terminate()
