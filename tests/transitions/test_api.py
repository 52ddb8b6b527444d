"""The public contract of ObjectRL's ReplayBuffer page, method by method, on RAM and memmap."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import replaystore
from replaystore.errors import ArgumentError, BufferIndexError, EmptyBufferError, SchemaError
from replaystore.transitions import ReplayBuffer, TransitionBuffer

from .conftest import batch, ids_of, transition


def test_transition_buffer_is_the_replay_buffer_class() -> None:
    assert replaystore.TransitionBuffer is ReplayBuffer
    assert TransitionBuffer is ReplayBuffer


def test_constructor_takes_the_seed_signature() -> None:
    buf = ReplayBuffer(
        device=torch.device("cpu"), storing_device=torch.device("cpu"), buffer_size=100_000
    )
    try:
        assert buf.buffer_size == 100_000
        assert buf.storage_kind == "memmap"  # ObjectRL: cpu storing device -> LazyMemmapStorage
        assert len(buf) == 0 and buf.size == 0 and buf.data_size == 0 and buf.pointer == 0
    finally:
        buf.close()


def test_cpu_storage_can_be_plain_ram() -> None:
    with ReplayBuffer("cpu", "cpu", 10, storage="memory") as buf:
        assert buf.storage_kind == "memory"
        assert buf.path is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 0}, "buffer_size"),
        ({"buffer_size": 2.5}, "buffer_size"),
        ({"sampler": "lifo"}, "sampler"),
        ({"storage": "disk"}, "storage"),
        ({"storage": "memory", "path": "x"}, "path"),
        ({"sampler": "prioritized", "alpha": -1.0}, "alpha"),
        ({"sampler": "prioritized", "eps": 0.0}, "eps"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"device": "cpu", "storing_device": "cpu", "buffer_size": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        ReplayBuffer(**args)


def test_add_stores_one_transition(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add(transition(7))
    assert len(buf) == 1 and buf.pointer == 1
    assert ids_of(buf.sample_all()).tolist() == [7]


def test_add_accepts_a_tensordict(make_buffer) -> None:
    buf = make_buffer(10)
    td = TensorDict(
        {"obs": torch.arange(3.0), "action": torch.tensor(2), "done": torch.tensor(True)},
        batch_size=[],
    )
    buf.add(td)
    out = buf.sample_all()
    assert torch.equal(out["obs"], torch.arange(3.0)[None])
    assert out["action"].tolist() == [2] and out["done"].tolist() == [True]


def test_schema_is_inferred_from_the_first_add(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add(transition(1))
    fields = buf.fields
    assert fields is not None
    assert {k: (f.shape, f.dtype) for k, f in fields.items()} == {
        "obs": ((3,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),  # Python float -> torch's default dtype
        "done": ((), torch.bool),
    }


def test_add_batch_stores_in_order(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(4)))
    buf.add_batch(TensorDict({k: torch.as_tensor(v) for k, v in batch([4, 5]).items()}, [2]))
    assert len(buf) == 6 and buf.pointer == 6
    assert ids_of(buf.sample_all()).tolist() == [0, 1, 2, 3, 4, 5]


def test_add_batch_accepts_lists(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add_batch({"x": [[1.0, 2.0], [3.0, 4.0]], "y": [1, 2]})
    out = buf.sample_all()
    assert out["x"].dtype == torch.float64 and out["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_single_and_batch_adds_mix(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add(transition(0))
    buf.add_batch(batch([1, 2]))
    buf.add(transition(3))
    assert ids_of(buf.sample_all()).tolist() == [0, 1, 2, 3]


def test_sample_batch_draws_stored_items_on_the_device(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(5)))
    out = buf.sample_batch(64)
    assert isinstance(out, TensorDict)
    assert out.batch_size == torch.Size([64]) and out.device == torch.device("cpu")
    ids = ids_of(out)
    assert set(ids.tolist()) <= set(range(5))
    assert len(set(ids.tolist())) == 5  # 64 draws over 5 items hit every item


def test_sample_batch_is_uniform_over_stored_items(make_buffer) -> None:
    from scipy import stats

    buf = make_buffer(8)
    buf.add_batch(batch(range(8)))
    ids = np.concatenate([ids_of(buf.sample_batch(1000)) for _ in range(8)])
    counts = np.bincount(ids, minlength=8)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_sample_random_is_an_alias_of_sample_batch(make_buffer) -> None:
    a, b = make_buffer(10, seed=3), make_buffer(10, seed=3)
    a.add_batch(batch(range(10)))
    b.add_batch(batch(range(10)))
    assert ids_of(a.sample_random(32)).tolist() == ids_of(b.sample_batch(32)).tolist()


def test_same_seed_gives_same_samples(make_buffer) -> None:
    a, b, c = make_buffer(50, seed=1), make_buffer(50, seed=1), make_buffer(50, seed=2)
    for buf in (a, b, c):
        buf.add_batch(batch(range(50)))
    draws = [ids_of(buf.sample_batch(20)).tolist() for buf in (a, b, c)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]


def test_sample_by_index_returns_rows_in_the_given_order(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10, 20)))
    assert ids_of(buf.sample_by_index([0, 5, 9])).tolist() == [10, 15, 19]
    assert ids_of(buf.sample_by_index(torch.tensor([3, 3, 1]))).tolist() == [13, 13, 11]
    assert ids_of(buf.sample_by_index(range(2, 5))).tolist() == [12, 13, 14]
    assert ids_of(buf.sample_by_index(np.array([9]))).tolist() == [19]


@pytest.mark.parametrize("bad", [[10], [-1], [0, 12]])
def test_sample_by_index_rejects_positions_not_stored(make_buffer, bad: list[int]) -> None:
    buf = make_buffer(20)
    buf.add_batch(batch(range(10)))
    with pytest.raises(BufferIndexError, match=str(bad[-1])):
        buf.sample_by_index(bad)


def test_sample_by_index_rejects_non_integer_indices(make_buffer) -> None:
    buf = make_buffer(5)
    buf.add_batch(batch(range(5)))
    with pytest.raises(BufferIndexError, match="integers"):
        buf.sample_by_index([0.5, 1.0])


def test_sample_by_index_fields_as_tuple_one_field_is_a_tensor(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    obs = buf.sample_by_index_fields([0, 5], fields=["obs"], as_tuple=True)
    assert isinstance(obs, torch.Tensor)
    assert obs[:, 0].tolist() == [0.0, 5.0]
    action = buf.sample_by_index_fields([0, 5], "action", as_tuple=True)
    assert torch.equal(action, torch.tensor([0, 0]))


def test_sample_by_index_fields_is_a_tensordict_of_those_fields(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    got = buf.sample_by_index_fields([1, 7], ["action", "obs"])
    assert isinstance(got, TensorDict)
    assert set(got.keys()) == {"action", "obs"}
    assert got.batch_size == torch.Size([2]) and got.device == buf.device
    assert got["obs"][:, 0].tolist() == [1.0, 7.0]
    assert set(buf.sample_by_index_fields([0], "obs").keys()) == {"obs"}


def test_sample_by_index_fields_several_fields_are_a_tuple_in_order(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    action, obs = buf.sample_by_index_fields([1, 7], fields=["action", "obs"], as_tuple=True)
    assert action.tolist() == [1, 2]
    assert obs[:, 0].tolist() == [1.0, 7.0]


def test_sample_by_index_fields_names_an_unknown_field(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(3)))
    with pytest.raises(SchemaError, match="'next_obs'"):
        buf.sample_by_index_fields([0], fields=["obs", "next_obs"])


def test_sample_all_returns_every_stored_item(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(7)))
    out = buf.sample_all()
    assert out.batch_size == torch.Size([7])
    assert ids_of(out).tolist() == list(range(7))


def test_sample_all_chronological_starts_at_the_oldest_item(make_buffer) -> None:
    buf = make_buffer(5)
    buf.add_batch(batch(range(8)))
    assert ids_of(buf.sample_all()).tolist() == [5, 6, 7, 3, 4]
    assert ids_of(buf.sample_all(chronological=True)).tolist() == [3, 4, 5, 6, 7]


def test_samples_are_copies_not_views_of_storage(make_buffer) -> None:
    buf = make_buffer(5)
    buf.add_batch(batch(range(5)))
    out = buf.sample_all()
    out["obs"].zero_()
    assert ids_of(buf.sample_all()).tolist() == list(range(5))


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.sample_batch(4),
        lambda b: b.sample_random(4),
        lambda b: b.sample_all(),
        lambda b: b.sample_by_index([0]),
        lambda b: b.sample_by_index_fields([0], ["obs"]),
        lambda b: b.create_epoch_iterator(4),
        lambda b: b.get_next_batch(4),
        lambda b: b.save("unused"),
    ],
)
def test_sampling_an_empty_buffer_raises(make_buffer, call) -> None:
    buf = make_buffer(5)
    with pytest.raises(EmptyBufferError):
        call(buf)


def test_sample_batch_rejects_non_positive_sizes(make_buffer) -> None:
    buf = make_buffer(5)
    buf.add(transition(0))
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError, match="batch_size"):
            buf.sample_batch(bad)


def test_size_and_len_count_stored_items_up_to_capacity(make_buffer) -> None:
    buf = make_buffer(6)
    for i in range(9):
        buf.add(transition(i))
        assert len(buf) == buf.size == buf.data_size == min(i + 1, 6)
    assert buf.pointer == 3


def test_reset_empties_the_buffer_and_forgets_the_schema(make_buffer) -> None:
    buf = make_buffer(6)
    buf.add_batch(batch(range(4)))
    buf.reset()
    assert len(buf) == 0 and buf.pointer == 0 and buf.fields is None
    buf.add({"other": np.zeros(2)})  # a new schema
    assert list(buf.sample_all().keys()) == ["other"]


def test_reset_can_resize(make_buffer) -> None:
    buf = make_buffer(6)
    buf.add_batch(batch(range(4)))
    buf.reset(buffer_size=3)
    assert buf.buffer_size == 3
    buf.add_batch(batch(range(5)))
    assert ids_of(buf.sample_all(chronological=True)).tolist() == [2, 3, 4]


def test_reset_logs_the_gc_warning_when_asked(make_buffer, caplog) -> None:
    buf = make_buffer(6, print_gc_warning=True)
    with caplog.at_level(logging.WARNING, logger="replaystore.transitions.buffer"):
        buf.reset()
    assert "garbage collector" in caplog.text


def test_seed_page_examples_run_as_written(make_buffer) -> None:
    buffer = make_buffer(100)
    single_experience = TensorDict(
        {"obs": torch.zeros(3), "action": torch.tensor(1), "reward": torch.tensor(0.5)}, []
    )
    batch_experience = TensorDict(
        {
            "obs": torch.ones(20, 3),
            "action": torch.ones(20, dtype=torch.int64),
            "reward": torch.ones(20),
        },
        [20],
    )
    buffer.add(single_experience)  # Single transition
    buffer.add_batch(batch_experience)  # Batch of transitions
    assert buffer.sample_batch(64).batch_size == torch.Size([64])
    assert buffer.sample_by_index([0, 5, 9]).batch_size == torch.Size([3])
    obs_act = buffer.sample_by_index_fields([0, 5], fields=["obs", "action"])
    assert obs_act["obs"].shape == (2, 3) and obs_act["action"].shape == (2,)
    assert buffer.sample_all().batch_size == torch.Size([21])
    assert len(buffer) == buffer.size == 21


def test_memmap_buffer_without_path_removes_its_directory_on_close() -> None:
    buf = ReplayBuffer("cpu", "cpu", 10)
    buf.add(transition(0))
    directory = buf.path
    assert directory is not None and Path(directory).is_dir()
    buf.close()
    assert not Path(directory).exists()


def test_sampled_tensordicts_behave_like_ordinary_ones(make_buffer) -> None:
    buf = make_buffer(10, sampler="prioritized")
    buf.add_batch(batch(range(10)))
    for out in (buf.sample_batch(6), buf.sample_by_index([1, 2, 3, 4, 5, 6]), buf.sample_all()):
        assert out.device == torch.device("cpu")
        assert out[:2].batch_size == torch.Size([2])
        assert out.to("cpu")["obs"].shape[1:] == (3,)
        doubled = out.apply(lambda t: t * 2)
        assert torch.equal(doubled["action"], out["action"] * 2)
        again = TensorDict({k: out[k] for k in out.keys()}, batch_size=out.batch_size)  # noqa: SIM118
        assert again.batch_size == out.batch_size


@pytest.mark.parametrize(
    "kwargs",
    [
        {"buffer_size": 0},
        {"buffer_size": 2.5},
        {"buffer_size": "10"},
        {"sampler": "lifo"},
        {"storage": "disk"},
        {"storage": "memory", "path": "x"},
        {"sampler": "prioritized", "alpha": -1.0},
        {"sampler": "prioritized", "beta": float("nan")},
        {"sampler": "prioritized", "eps": 0.0},
    ],
)
def test_every_bad_constructor_argument_raises_an_argument_error(kwargs: dict) -> None:
    args = {"device": "cpu", "storing_device": "cpu", "buffer_size": 10, **kwargs}
    with pytest.raises(ArgumentError):
        ReplayBuffer(**args)


def test_bad_batch_sizes_and_epoch_counts_raise_argument_errors(make_buffer) -> None:
    buf = make_buffer(8)
    buf.add_batch(batch(range(8)))
    calls = [
        lambda: buf.sample_batch(0),
        lambda: buf.sample_batch("4"),
        lambda: buf.create_epoch_iterator(0),
        lambda: buf.create_epoch_iterator(4, n_epochs=0),
        lambda: buf.get_steps_and_iterator(-1, 0, 4),
        lambda: buf.get_steps_and_iterator(1, -1, 4),
        lambda: buf.calculate_num_batches(1.5),
        lambda: buf.reset(buffer_size=0),
    ]
    for call in calls:
        with pytest.raises(ArgumentError):
            call()
    assert len(buf) == 8  # a refused reset changed nothing
    with pytest.raises(ArgumentError, match="beta"):
        buf.beta = -1.0


def test_a_refused_constructor_creates_no_directory(tmp_path: Path) -> None:
    target = tmp_path / "never"
    with pytest.raises(ArgumentError, match="alpha"):
        ReplayBuffer("cpu", "cpu", 10, sampler="prioritized", alpha=-1.0, path=target)
    with pytest.raises(ArgumentError, match="add_backend"):
        ReplayBuffer("cpu", "cpu", 10, add_backend="fortran", path=target)  # type: ignore[arg-type]
    assert not target.exists()
