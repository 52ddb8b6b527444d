"""n-step returns (issue 26 item 3) against a slow reference loop.

Every case fills a small ring with random episodes (``done`` at random places,
so episode ends fall at the ring's wrap and at the newest step too), then
compares each stored position's n-step entries with :func:`reference`, a plain
Python loop over the definition. ``obs`` holds the add counter, so a sampled
row tells its storage position (``counter % capacity``) even without ``index``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import ArgumentError, BufferIndexError, ConfigError, SchemaError
from replaystore.transitions import ReplayBuffer
from replaystore.transitions import nstep as nstep_module
from replaystore.transitions.nstep import NStepReader, nstep_fields

N_STEPS = (1, 2, 3, 5)
PATHS = [
    "torch",
    "numpy",
    pytest.param(
        "c",
        marks=pytest.mark.skipif(
            nstep_module._cnstep is None, reason="replaystore._nstep is not built (no C compiler)"
        ),
    ),
]


def reader(path: str, storage: Any, n: int, gamma: float) -> NStepReader:
    """An NStepReader on ``storage`` computing with ``path``: the kernel, NumPy or torch."""
    nstep = NStepReader(n, gamma, backend="c" if path == "c" else "numpy")
    nstep.bind(storage.columns, {} if path == "torch" else storage.arrays)
    assert nstep.backend == path
    return nstep


def episodes(rng: np.random.Generator, count: int, *, keys: tuple[str, ...] = ()) -> dict:
    """``count`` transitions with random episode ends; ``keys`` adds terminated/truncated."""
    p_end = rng.choice([0.05, 0.2, 0.5])
    ids = np.arange(count)
    data: dict[str, Any] = {
        "obs": ids.astype(np.float32)[:, None] * np.ones(2, np.float32),
        "action": rng.integers(0, 3, count),
        "reward": rng.normal(size=count).astype(np.float32),
        "next_obs": (ids.astype(np.float32) + 0.5)[:, None] * np.ones(2, np.float32),
        "done": rng.random(count) < p_end,
    }
    for key in keys:
        data[key] = rng.random(count) < p_end / 2
    return data


def reference(
    data: dict[str, np.ndarray], t: int, n: int, gamma: float, size: int, pointer: int, cap: int
) -> tuple[float, np.ndarray, bool, float, bool]:
    """The definition, one step at a time: (return, next_obs, done, discount, terminated)."""
    newest = (pointer - 1) % cap
    ret, m, done, terminated, pos = 0.0, 0, False, False, t
    for k in range(n):
        ret += gamma**k * float(data["reward"][pos])
        m += 1
        ended = any(
            bool(data[key][pos]) for key in ("done", "terminated", "truncated") if key in data
        )
        if ended:
            done = True
            terminated = "terminated" in data and bool(data["terminated"][pos])
            break
        if pos == newest or k == n - 1:
            break
        pos = (pos + 1) % cap
    return ret, data["next_obs"][pos], done, gamma**m, terminated


def stored_columns(buf: ReplayBuffer) -> dict[str, np.ndarray]:
    everything = buf.sample_all()
    return {key: everything[key].numpy() for key in everything.keys()}  # noqa: SIM118


def assert_matches_reference(
    fields: dict[str, torch.Tensor],
    positions: np.ndarray,
    columns: dict[str, np.ndarray],
    n: int,
    gamma: float,
    size: int,
    pointer: int,
    cap: int,
) -> None:
    flat = {k: v.reshape(positions.size, *v.shape[positions.ndim :]) for k, v in fields.items()}
    for row, t in enumerate(positions.reshape(-1)):
        ret, next_obs, done, discount, terminated = reference(
            columns, int(t), n, gamma, size, pointer, cap
        )
        where = f"position {t} (n={n}, size={size}, pointer={pointer})"
        assert math.isclose(float(flat["n_step_return"][row]), ret, rel_tol=1e-5, abs_tol=1e-5), (
            where
        )
        np.testing.assert_array_equal(flat["n_step_next_obs"][row].numpy(), next_obs, err_msg=where)
        assert bool(flat["n_step_done"][row]) == done, where
        assert math.isclose(float(flat["n_step_discount"][row]), discount, rel_tol=1e-6), where
        if "terminated" in columns:
            assert bool(flat["n_step_terminated"][row]) == terminated, where


def filled(rng: np.random.Generator, storage: str, keys: tuple[str, ...] = (), **kw: Any):
    cap = int(rng.integers(4, 24))
    count = int(rng.integers(1, 3 * cap))
    buf = ReplayBuffer("cpu", "cpu", cap, storage=storage, seed=0, **kw)
    buf.add_batch(episodes(rng, count, keys=keys))
    return buf, cap


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("keys", [(), ("terminated", "truncated")])
def test_nstep_fields_of_every_stored_position_match_the_reference(storage, path, keys):
    rng = np.random.default_rng(hash((storage, path, keys)) % 2**32)
    for _ in range(25):
        buf, cap = filled(rng, storage, keys)
        columns = stored_columns(buf)
        size, pointer = buf.size, buf.pointer
        positions = np.arange(size)
        storage_obj = buf._storage
        assert storage_obj is not None
        for n in N_STEPS:
            gamma = float(rng.choice([0.0, 0.5, 0.99, 1.0]))
            nstep = reader(path, storage_obj, n, gamma)
            out = nstep.fields(torch.from_numpy(positions), pointer)
            assert_matches_reference(out, positions, columns, n, gamma, size, pointer, cap)
        buf.close()


def test_a_window_stops_at_the_newest_step_across_the_wrap():
    # capacity 5, 7 adds: positions 0,1 hold ids 5,6 (6 is the newest), 2..4 hold ids 2..4.
    buf = ReplayBuffer("cpu", "cpu", 5, storage="memory")
    data = episodes(np.random.default_rng(0), 7)
    data["done"][:] = False
    data["reward"][:] = np.arange(7, dtype=np.float32)
    buf.add_batch(data)
    assert buf.pointer == 2
    out = nstep_fields(
        buf._storage.columns, torch.tensor([4, 0, 1]), n_step=5, gamma=1.0, size=5, pointer=2
    )
    # id 4 at position 4 runs over the wrap to ids 5, 6 and stops at the newest: 4 + 5 + 6.
    assert out["n_step_return"].tolist() == [15.0, 11.0, 6.0]
    assert out["n_step_next_obs"][:, 0].tolist() == [6.5, 6.5, 6.5]
    assert out["n_step_done"].tolist() == [False, False, False]
    assert out["n_step_discount"].tolist() == [1.0, 1.0, 1.0]


def test_a_two_dimensional_index_gives_two_dimensional_fields():
    rng = np.random.default_rng(7)
    buf, cap = filled(rng, "memory")
    columns = stored_columns(buf)
    index = torch.from_numpy(rng.integers(0, buf.size, (4, 3)))
    out = nstep_fields(
        buf._storage.columns, index, n_step=3, gamma=0.9, size=buf.size, pointer=buf.pointer
    )
    assert out["n_step_return"].shape == (4, 3)
    assert out["n_step_next_obs"].shape == (4, 3, 2)
    assert out["n_step_done"].shape == (4, 3) and out["n_step_done"].dtype == torch.bool
    assert out["n_step_discount"].shape == (4, 3)
    assert_matches_reference(out, index.numpy(), columns, 3, 0.9, buf.size, buf.pointer, cap)


@pytest.mark.parametrize("path", PATHS)
def test_masked_positions_are_zero(path):
    rng = np.random.default_rng(3)
    buf, cap = filled(rng, "memory")
    columns = stored_columns(buf)
    index = torch.tensor([[0, 1, -1], [2, -7, 99]])
    mask = index >= 0
    mask[1, 2] = False
    storage = buf._storage
    out = reader(path, storage, 3, 0.9).fields(index, buf.pointer, mask)
    for key, value in out.items():
        assert not value[~mask].any(), key
    real = index[mask].numpy()
    kept = {k: v[mask] for k, v in out.items()}
    assert_matches_reference(kept, real, columns, 3, 0.9, buf.size, buf.pointer, cap)


def test_reward_dtype_and_shapes_are_kept():
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory")
    buf.add_batch(
        {
            "reward": np.ones((6, 1), np.float64),
            "done": np.zeros((6, 1), np.float32),  # a float flag column of item shape [1]
            "next_obs": np.zeros((6, 3), np.uint8),
        }
    )
    out = nstep_fields(
        buf._storage.columns, torch.arange(6), n_step=2, gamma=0.5, size=6, pointer=6
    )
    assert out["n_step_return"].dtype == torch.float64 and out["n_step_return"].shape == (6, 1)
    assert out["n_step_return"][:, 0].tolist() == [1.5, 1.5, 1.5, 1.5, 1.5, 1.0]
    assert out["n_step_done"].dtype == torch.bool and out["n_step_done"].shape == (6, 1)
    assert out["n_step_discount"].dtype == torch.float32
    assert out["n_step_next_obs"].dtype == torch.uint8


@pytest.mark.parametrize("path", PATHS)
def test_nan_rewards_after_an_episode_end_do_not_enter_the_return(path):
    buf = ReplayBuffer("cpu", "cpu", 4, storage="memory")
    buf.add_batch(
        {
            "reward": np.array([1.0, 2.0, np.nan, 4.0], np.float32),
            "done": np.array([False, True, False, False]),
            "next_obs": np.zeros((4, 1), np.float32),
        }
    )
    out = reader(path, buf._storage, 3, 1.0).fields(torch.tensor([0]), 0)
    assert out["n_step_return"].tolist() == [3.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_step": 0}, "n_step must be a positive integer"),
        ({"n_step": 2.5}, "n_step must be a positive integer"),
        ({"n_step": "3"}, "n_step must be a positive integer"),
        ({"gamma": -0.1}, "gamma must be finite and >= 0"),
        ({"gamma": 1.5}, "gamma must be a number in [0, 1]"),
        ({"gamma": float("nan")}, "gamma must be finite"),
    ],
)
def test_bad_nstep_config_is_refused_at_construction(kwargs, message):
    with pytest.raises(ArgumentError) as info:
        ReplayBuffer("cpu", "cpu", 8, storage="memory", **{"n_step": 3, **kwargs})
    assert message in str(info.value)


def test_nstep_fields_checks_its_arguments():
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory")
    buf.add_batch(episodes(np.random.default_rng(0), 5))
    cols = buf._storage.columns
    with pytest.raises(BufferIndexError, match="index 5 is out of range"):
        nstep_fields(cols, torch.tensor([0, 5]), n_step=2, gamma=0.9, size=5, pointer=5)
    with pytest.raises(BufferIndexError, match="pointer == size"):
        nstep_fields(cols, torch.tensor([0]), n_step=2, gamma=0.9, size=5, pointer=3)
    with pytest.raises(ArgumentError, match="mask must have the shape of index"):
        nstep_fields(
            cols, torch.tensor([0]), n_step=2, gamma=0.9, size=5, pointer=5, mask=torch.ones(2)
        )
    with pytest.raises(ConfigError, match="missing 'next_obs'"):
        nstep_fields(
            {k: v for k, v in cols.items() if k != "next_obs"},
            torch.tensor([0]),
            n_step=2,
            gamma=0.9,
            size=5,
            pointer=5,
        )
    with pytest.raises(SchemaError, match="one 'done' flag per step"):
        nstep_fields(
            {**cols, "done": torch.zeros(8, 2, dtype=torch.bool)},
            torch.tensor([0]),
            n_step=2,
            gamma=0.9,
            size=5,
            pointer=5,
        )


# ------------------------------------------------------------------ through the buffer


def positions_of(batch: Any, cap: int) -> np.ndarray:
    """Storage positions of sampled rows: ``obs`` holds the add counter."""
    return batch["obs"][..., 0].numpy().astype(np.int64) % cap


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
@pytest.mark.parametrize("n", N_STEPS[1:])
def test_sample_batch_nstep_entries_match_the_reference(storage, sampler, n):
    rng = np.random.default_rng(n * 7 + (sampler == "uniform") + 2 * (storage == "memory"))
    for _ in range(8):
        gamma = float(rng.choice([0.5, 0.99, 1.0]))
        buf, cap = filled(rng, storage, sampler=sampler, n_step=n, gamma=gamma)
        batch = buf.sample_batch(64)
        positions = positions_of(batch, cap)
        if sampler == "prioritized":
            np.testing.assert_array_equal(batch["index"].numpy(), positions)
        fields = {k: batch[k] for k in batch.keys() if k.startswith("n_step_")}  # noqa: SIM118
        columns = stored_columns(buf)
        assert_matches_reference(fields, positions, columns, n, gamma, buf.size, buf.pointer, cap)
        buf.close()


def test_default_n_step_1_gives_todays_batch_unchanged():
    rng = np.random.default_rng(11)
    data = episodes(rng, 30)
    batches = []
    for kwargs in ({}, {"n_step": 1, "gamma": 0.5}):
        buf = ReplayBuffer("cpu", "cpu", 20, storage="memory", seed=5, **kwargs)
        buf.add_batch(data)
        batches.append(buf.sample_batch(16))
    assert set(batches[0].keys()) == set(data)
    assert (batches[0] == batches[1]).all()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_n_step_adds_entries_without_changing_the_draws(sampler):
    data = episodes(np.random.default_rng(12), 30)
    one = ReplayBuffer("cpu", "cpu", 20, storage="memory", seed=5, sampler=sampler)
    three = ReplayBuffer("cpu", "cpu", 20, storage="memory", seed=5, sampler=sampler, n_step=3)
    one.add_batch(data)
    three.add_batch(data)
    plain, multi = one.sample_batch(16), three.sample_batch(16)
    assert set(multi.keys()) - set(plain.keys()) == {
        "n_step_return",
        "n_step_next_obs",
        "n_step_done",
        "n_step_discount",
    }
    for key in plain.keys():  # noqa: SIM118
        assert torch.equal(plain[key], multi[key]), key


@pytest.mark.parametrize("prioritized", [False, True])
def test_slices_get_nstep_entries_of_shape_s_l_and_zeros_on_padding(prioritized):
    from replaystore.transitions import SliceSampler

    rng = np.random.default_rng(21)
    sampler = SliceSampler(4, strict=False, prioritized=prioritized)
    buf = ReplayBuffer("cpu", "cpu", 40, storage="memory", seed=1, sampler=sampler, n_step=3)
    data = episodes(rng, 90)
    data["done"] = rng.random(90) < 0.3  # many episodes shorter than a slice: padding
    buf.add_batch(data)
    batch = buf.sample_batch(64)
    assert batch.batch_size == torch.Size([16, 4])
    mask = batch["mask"]
    assert not mask.all(), "the case needs padded slices"
    assert batch["n_step_return"].shape == (16, 4)
    assert batch["n_step_next_obs"].shape == (16, 4, 2)
    for key in ("n_step_return", "n_step_next_obs", "n_step_done", "n_step_discount"):
        assert not batch[key][~mask].any(), key
    real = batch["index"][mask].numpy()
    fields = {k: batch[k][mask] for k in batch.keys() if k.startswith("n_step_")}  # noqa: SIM118
    columns = stored_columns(buf)
    assert_matches_reference(fields, real, columns, 3, 0.99, buf.size, buf.pointer, 40)


def test_epoch_batches_and_sample_by_index_carry_the_entries():
    rng = np.random.default_rng(5)
    buf = ReplayBuffer("cpu", "cpu", 16, storage="memory", seed=0, n_step=2, gamma=0.9)
    buf.add_batch(episodes(rng, 21))
    columns = stored_columns(buf)
    every = torch.cat([b["n_step_return"] for b in buf.create_epoch_iterator(4, shuffle=False)])
    by_index = buf.sample_by_index(range(16))
    assert torch.equal(every, by_index["n_step_return"])
    fields = {k: by_index[k] for k in by_index.keys() if k.startswith("n_step_")}  # noqa: SIM118
    assert_matches_reference(fields, np.arange(16), columns, 2, 0.9, 16, buf.pointer, 16)
    buf.get_steps_and_iterator(1, 0, 8)
    assert "n_step_return" in buf.get_next_batch(8).keys()  # noqa: SIM118


def test_n_step_needs_reward_done_and_next_obs_at_the_first_add():
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", n_step=3)
    with pytest.raises(ConfigError) as info:
        buf.add({"obs": np.zeros(2, np.float32), "reward": 1.0, "done": False})
    message = str(info.value)
    assert "n_step=3 needs the keys 'reward', 'done' and 'next_obs'" in message
    assert "missing 'next_obs'" in message and "'obs', 'reward', 'done'" in message
    assert len(buf) == 0 and buf.fields is None
    with pytest.raises(ConfigError, match="missing 'reward' and 'done'"):
        buf.add_batch({"next_obs": np.zeros((2, 2), np.float32)})
    buf.add({"reward": 1.0, "done": False, "next_obs": np.zeros(2, np.float32)})  # then it works
    assert len(buf) == 1


def test_n_step_refuses_checkpoints_and_memmap_directories_without_the_keys(tmp_path):
    plain = {"obs": np.zeros((3, 2), np.float32), "reward": np.ones(3, np.float32)}
    src = ReplayBuffer("cpu", "cpu", 8, storage="memory")
    src.add_batch(plain)
    src.save(tmp_path / "ckpt" / "buffer")
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", n_step=2)
    with pytest.raises(ConfigError, match=r"checkpoint .*missing 'done' and 'next_obs'"):
        buf.load(tmp_path / "ckpt" / "buffer")
    assert len(buf) == 0
    with ReplayBuffer("cpu", "cpu", 8, path=tmp_path / "mm") as disk:
        disk.add_batch(plain)
    with pytest.raises(ConfigError, match="missing 'done' and 'next_obs'"):
        ReplayBuffer("cpu", "cpu", 8, path=tmp_path / "mm", n_step=2)


def test_n_step_entry_names_are_reserved():
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", n_step=2)
    with pytest.raises(SchemaError, match="n_step_return"):
        buf.add({"reward": 1.0, "done": False, "next_obs": [0.0], "n_step_return": 1.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_cuda_storage_computes_the_entries_on_the_device(sampler):
    rng = np.random.default_rng(31)
    for _ in range(5):
        cap = int(rng.integers(4, 24))
        buf = ReplayBuffer("cuda", "cuda", cap, sampler=sampler, n_step=3, gamma=0.9, seed=0)
        buf.add_batch(episodes(rng, int(rng.integers(1, 3 * cap))))
        batch = buf.sample_batch(32)
        assert batch["n_step_return"].device.type == "cuda"
        host = batch.cpu()
        everything = buf.sample_all().cpu()
        columns = {key: everything[key].numpy() for key in everything.keys()}  # noqa: SIM118
        fields = {k: host[k] for k in host.keys() if k.startswith("n_step_")}  # noqa: SIM118
        positions = positions_of(host, cap)
        assert_matches_reference(fields, positions, columns, 3, 0.9, buf.size, buf.pointer, cap)


@pytest.mark.skipif(nstep_module._cnstep is None, reason="replaystore._nstep is not built")
def test_kernel_and_numpy_give_identical_entries():
    rng = np.random.default_rng(41)
    for _ in range(20):
        buf, _ = filled(rng, "memory", ("terminated",))
        index = torch.from_numpy(rng.integers(0, buf.size, 300))
        gamma = float(rng.random())
        by_c = reader("c", buf._storage, 4, gamma).fields(index, buf.pointer)
        by_numpy = reader("numpy", buf._storage, 4, gamma).fields(index, buf.pointer)
        assert by_c.keys() == by_numpy.keys()
        for key, value in by_c.items():
            assert value.dtype == by_numpy[key].dtype, key
            assert torch.equal(value, by_numpy[key]), key


@pytest.mark.parametrize("path", PATHS)
def test_fill_adds_what_fields_returns(path):
    """``fill`` (what a uniform or prioritized draw calls) gives ``fields``' entries,
    for the sampler's int64 positions and for positions of another integer dtype."""
    rng = np.random.default_rng(43)
    for keys in ((), ("terminated",)):
        for _ in range(10):
            buf, _ = filled(rng, "memory", keys)
            nstep = reader(path, buf._storage, 3, 0.9)
            for dtype in (np.int64, np.int32):
                positions = rng.integers(0, buf.size, 50).astype(dtype)
                out: dict[str, torch.Tensor] = {"obs": torch.zeros(1)}
                nstep.fill(out, positions, buf.pointer)
                expected = nstep.fields(torch.from_numpy(positions.astype(np.int64)), buf.pointer)
                assert out.keys() == {"obs", *expected.keys()}
                for key, value in expected.items():
                    assert out[key].dtype == value.dtype, key
                    assert torch.equal(out[key], value), key


def test_kernel_is_used_only_for_what_it_reads():
    rows = {"reward": np.ones(4, np.float32), "next_obs": np.zeros((4, 2), np.float32)}
    flags = {"done": np.zeros(4, bool)}
    for extra, expected in (
        ({}, "c"),
        ({"done": np.zeros(4, np.float32)}, "numpy"),  # a float flag column
        ({"reward": np.ones((4, 2), np.float32)}, "numpy"),  # two rewards per step
        ({"reward": np.ones(4, np.int64)}, "numpy"),
    ):
        buf = ReplayBuffer("cpu", "cpu", 8, storage="memory")
        buf.add_batch({**rows, **flags, **extra})
        nstep = NStepReader(2, 0.9)
        nstep.bind(buf._storage.columns, buf._storage.arrays)
        if nstep_module._cnstep is None:
            expected = "numpy"
        assert nstep.backend == expected, extra
    with pytest.raises(ArgumentError, match="backend must be 'auto', 'c' or 'numpy'"):
        NStepReader(2, 0.9, backend="fast")


def test_a_missing_kernel_is_said_once_when_an_n_step_buffer_is_made(monkeypatch):
    import warnings

    from replaystore import _kernels
    from replaystore.errors import CompiledKernelWarning

    monkeypatch.setattr(_kernels, "_warned", False)
    monkeypatch.delenv("REPLAYSTORE_NSTEP", raising=False)
    monkeypatch.setattr(nstep_module, "_cnstep", None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ReplayBuffer("cpu", "cpu", 8, storage="memory", n_step=3)
        ReplayBuffer("cpu", "cpu", 8, storage="memory")  # n_step=1 needs no kernel
    (message,) = [str(w.message) for w in record if w.category is CompiledKernelWarning]
    assert "replaystore._nstep is not installed" in message
    assert "REPLAYSTORE_NSTEP=numpy" in message


@pytest.mark.skipif(nstep_module._cnstep is None, reason="replaystore._nstep is not built")
def test_kernel_refuses_mismatched_buffers_and_positions_outside_the_ring():
    plan_type = nstep_module._cnstep.Plan
    flags = (np.zeros(4, bool),)
    reward, powers, next_obs = np.ones(4, np.float32), np.ones(3), np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="same cap"):
        plan_type(flags, np.ones(5, np.float32), powers, next_obs, -1)
    with pytest.raises(TypeError, match="reward must be a 1-d contiguous array of float32"):
        plan_type(flags, np.ones(4, np.int32), powers, next_obs, -1)
    window = plan_type(flags, reward, powers, next_obs, -1).window
    out = (np.empty(2, np.float32), np.empty((2, 2), np.float32), np.empty(2, bool))
    discount = np.empty(2, np.float32)
    with pytest.raises(ValueError, match=r"t\[1\] = 4 is outside \[0, 4\)"):
        window(np.array([0, 4]), 0, *out, discount, None)
    with pytest.raises(ValueError, match="len\\(t\\) rows"):
        window(np.array([0, 1, 2]), 0, *out, discount, None)
    window(np.array([0, 3]), 0, *out, discount, None)  # n = 2; pointer 0: the newest is row 3
    assert out[0].tolist() == [2.0, 1.0] and discount.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_closing_or_resetting_the_buffer_lets_go_of_its_columns(storage):
    buf = ReplayBuffer("cpu", "cpu", 8, storage=storage, n_step=2)
    buf.add_batch(episodes(np.random.default_rng(0), 5))
    reader = buf._gatherer.nstep
    assert reader is not None and reader._columns
    buf.reset()
    assert not reader._columns and reader._plan is None and reader._arrays is None
    buf.add_batch(episodes(np.random.default_rng(1), 5))
    assert "n_step_return" in buf.sample_batch(4).keys()  # noqa: SIM118
    buf.close()
    assert not reader._columns and reader._plan is None
