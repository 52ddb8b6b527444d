"""ObjectRL (fb49c5f): its replay-buffer call sites, replayed with only the import changed.

``from objectrl.replay_buffers.experience_memory import ReplayBuffer`` ->
``from replaystore.transitions import ReplayBuffer``. The sequences below are
shaped like ObjectRL's ``BaseAgent`` (construction, ``generate_transition`` +
``store_transition``), its models' ``learn`` loops (``get_steps_and_iterator`` +
``get_next_batch``; PPO's ``sample_all`` -> ``reset`` -> ``add_batch``), and
its buffer tests (``len``/``size``, ``sample_by_index_fields``, ``save``/``load``
of the ``.metadata`` file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from replaystore.errors import CheckpointError
from replaystore.transitions import ReplayBuffer
from replaystore.transitions.checkpoint import read_objectrl_metadata

STATE_DIM = 3


def _transition(step: int, device: torch.device) -> TensorDict:
    # the shape of ObjectRL's BaseAgent.generate_transition: scalars as Python floats/ints
    return TensorDict(
        {
            "state": torch.full((STATE_DIM,), float(step)).to(device),
            "action": torch.tensor([float(step % 2)]).to(device),
            "reward": float(step),
            "next_state": torch.full((STATE_DIM,), float(step + 1)).to(device),
            "terminated": float(step % 5 == 4),
            "truncated": float(0),
            "step": step,
        }
    )


def _agent_buffer(buffer_size: int, n: int) -> ReplayBuffer:
    memory = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), buffer_size, seed=0)
    device = memory.storing_device
    for step in range(n):
        memory.add(_transition(step, device))  # BaseAgent.store_transition
    return memory


def test_agent_stores_transitions_and_len_and_size_agree():
    memory = _agent_buffer(10, 7)
    assert len(memory) == 7
    assert memory.size == 7  # ObjectRL: a property
    assert memory.size() == 7  # and the method spelling
    assert isinstance(memory.size, int) and json.dumps(memory.size) == "7"
    assert memory.data_size == 7 and memory.pointer == 7 and memory.buffer_size == 10


def test_learn_loop_with_epochs_and_with_max_iter():
    memory = _agent_buffer(100, 40)
    n_steps = memory.get_steps_and_iterator(n_epochs=2, max_iter=1, batch_size=8)
    assert n_steps == 2 * memory.calculate_num_batches(8) == 10
    seen = []
    for _ in range(n_steps):
        batch = memory.get_next_batch(8)
        assert batch["state"].shape == (8, STATE_DIM)
        seen.extend(batch["step"].tolist())
    assert sorted(seen) == sorted(list(range(40)) * 2)

    n_steps = memory.get_steps_and_iterator(n_epochs=0, max_iter=5, batch_size=8)
    assert n_steps == 5
    for _ in range(n_steps):
        assert memory.get_next_batch(8).batch_size == torch.Size([8])


def test_ppo_rewrites_the_memory_with_sample_all_reset_add_batch():
    memory = _agent_buffer(64, 12)
    batch = memory.sample_all()
    rewards = batch["reward"].reshape(-1, 1)
    batch["advantages"] = (rewards - rewards.mean()).reshape(-1)
    batch["returns"] = rewards.reshape(-1) * 2
    memory.reset()
    assert len(memory) == 0
    memory.add_batch(TensorDict(dict(batch), batch_size=[rewards.shape[0]]))
    again = memory.sample_all()
    assert len(memory) == 12
    assert torch.equal(again["returns"], torch.arange(12, dtype=torch.float32) * 2)


def test_sample_by_index_fields_returns_a_tensordict_as_objectrl_does():
    memory = _agent_buffer(10, 6)
    indices = [0, 1, 2]
    result = memory.sample_by_index_fields(indices, ["state", "action"])
    assert isinstance(result, TensorDict)
    assert set(result.keys()) == {"state", "action"}
    assert result.batch_size == torch.Size([3])
    assert result["state"][:, 0].tolist() == [0.0, 1.0, 2.0]
    # range and tensor indices, as ObjectRL accepts them
    assert memory.sample_by_index_fields(range(2), ["reward"])["reward"].tolist() == [0.0, 1.0]
    got = memory.sample_by_index_fields(torch.tensor([5]), ["step"])
    assert got["step"].tolist() == [5]
    # ours on request: bare tensors
    state, action = memory.sample_by_index_fields(indices, ["state", "action"], as_tuple=True)
    assert torch.equal(state, result["state"]) and torch.equal(action, result["action"])


def _objectrl_save(path: Path, buffer_size: int, data_size: int, pointer: int) -> None:
    # what ObjectRL's ReplayBuffer.save writes: torch.save of three counters
    metadata = {"buffer_size": buffer_size, "data_size": data_size, "pointer": pointer}
    torch.save(metadata, str(path) + ".metadata")


def test_objectrl_metadata_file_loads_as_objectrl_loads_it(tmp_path):
    memory = _agent_buffer(10, 6)
    path = tmp_path / "buffer"
    _objectrl_save(path, 10, 4, 4)  # saved when it held 4 transitions
    assert read_objectrl_metadata(path) is not None
    memory.load(str(path))
    assert memory.buffer_size == 10 and memory.data_size == 4 and memory.pointer == 4
    assert len(memory) == memory.size == 4
    assert memory.sample_all()["step"].tolist() == [0, 1, 2, 3]
    memory.add(_transition(99, memory.storing_device))
    assert memory.sample_by_index([4])["step"].tolist() == [99]


def test_objectrl_metadata_with_more_data_than_held_is_refused_naming_why(tmp_path):
    memory = _agent_buffer(10, 3)
    path = tmp_path / "buffer"
    _objectrl_save(path, 10, 6, 6)
    with pytest.raises(CheckpointError, match=r"metadata-only.*data_size=6.*holds 3"):
        memory.load(str(path))
    assert len(memory) == 3
    _objectrl_save(path, 20, 2, 2)
    with pytest.raises(CheckpointError, match=r"buffer_size 20.*reset\(buffer_size=20\)"):
        memory.load(str(path))


_SIDE_EFFECTS: list[str] = []


def _side_effect() -> int:
    _SIDE_EFFECTS.append("ran")
    return 1


class _Evil:
    def __reduce__(self):
        return (_side_effect, ())


def test_a_metadata_pickle_with_anything_but_ints_is_refused_without_running_it(tmp_path):
    path = tmp_path / "buffer"
    torch.save({"buffer_size": 10, "data_size": _Evil(), "pointer": 0}, str(path) + ".metadata")
    memory = _agent_buffer(10, 3)
    with pytest.raises(CheckpointError, match="unexpected pickle opcode"):
        memory.load(str(path))
    assert _SIDE_EFFECTS == []
    assert len(memory) == 3


def test_our_save_keeps_objectrls_keys_and_adds_the_contents(tmp_path):
    memory = _agent_buffer(10, 6)
    path = tmp_path / "buffer"
    memory.save(str(path))
    meta = json.loads((tmp_path / "buffer.metadata").read_text())
    assert (meta["buffer_size"], meta["data_size"], meta["pointer"]) == (10, 6, 6)
    fresh = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), 10)
    fresh.load(str(path))  # a fresh buffer gets the transitions back, not only the counters
    assert fresh.sample_all()["step"].tolist() == list(range(6))
