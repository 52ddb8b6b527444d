"""The guarded private tensordict constructor and its public fallback."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version
from tensordict import TensorDict

from replaystore import _tensordict_compat as compat

ROOT = Path(__file__).resolve().parents[1]


def _entries(n: int = 4) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(n, 3), "action": torch.arange(n), "done": torch.zeros(n)}


def _check(td: TensorDict, entries: dict[str, torch.Tensor], n: int) -> None:
    assert isinstance(td, TensorDict)
    assert td.batch_size == torch.Size([n])
    assert td.device == torch.device("cpu")
    assert set(td.keys()) == set(entries)
    for key, value in entries.items():
        assert td.get(key) is value  # not copied


def test_installed_tensordict_is_in_the_pinned_range_and_takes_the_fast_path() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d) for d in deps if Requirement(d).name == "tensordict"]
    import tensordict

    assert spec.specifier.contains(Version(tensordict.__version__)), (spec, tensordict.__version__)
    assert any(s.operator == "<" for s in spec.specifier), "tensordict needs an upper bound"
    # `replaystore info` states the same range.
    assert spec.specifier == Requirement(f"tensordict{compat.SUPPORTED}").specifier
    assert compat.in_supported_range(tensordict.__version__)
    # Inside the range the probe accepts the private constructor.
    assert compat.FAST_PATH


@pytest.mark.parametrize("builder", [compat.batch_tensordict, compat.public_tensordict])
def test_both_paths_build_the_same_tensordict(builder) -> None:
    entries = _entries(5)
    _check(builder(dict(entries), 5, torch.device("cpu")), entries, 5)


def test_probe_falls_back_when_the_private_api_is_gone(monkeypatch, caplog) -> None:
    monkeypatch.delattr(TensorDict, "_new_unsafe")
    with caplog.at_level(logging.INFO, logger="replaystore.tensordict"):
        chosen = compat._probe(compat._unchecked_tensordict)
    assert chosen is compat.public_tensordict
    assert "fast path unavailable" in caplog.text
    entries = _entries()
    _check(chosen(dict(entries), 4, torch.device("cpu")), entries, 4)


def test_probe_falls_back_when_the_private_api_changes_meaning(monkeypatch) -> None:
    # A release whose _new_unsafe ignores batch_size: the probe notices the mismatch.
    def wrong(cls, source, batch_size=None, nested=True, **kw):
        return TensorDict(source, batch_size=torch.Size([]))

    monkeypatch.setattr(TensorDict, "_new_unsafe", classmethod(wrong))
    assert compat._probe(compat._unchecked_tensordict) is compat.public_tensordict


def test_probe_falls_back_when_the_signature_changes(monkeypatch) -> None:
    def renamed(cls, source, *, batch_dims):
        raise AssertionError("never reached")

    monkeypatch.setattr(TensorDict, "_new_unsafe", classmethod(renamed))
    assert compat._probe(compat._unchecked_tensordict) is compat.public_tensordict


def test_fallback_checks_what_the_fast_path_trusts() -> None:
    with pytest.raises(RuntimeError):
        compat.public_tensordict({"x": torch.zeros(3)}, 4, torch.device("cpu"))


def test_transition_samples_are_correct_on_the_fallback(monkeypatch) -> None:
    from replaystore.transitions import ReplayBuffer

    calls = []
    real = compat.public_tensordict

    def counting(entries, n, device):
        calls.append(n)
        return real(entries, n, device)

    monkeypatch.setattr(compat, "_BUILDER", counting)
    buf = ReplayBuffer("cpu", "cpu", 16, seed=0)
    for i in range(8):
        buf.add({"state": torch.full((3,), float(i)), "reward": torch.tensor(float(i))})
    batch = buf.sample_batch(4)
    assert calls == [4]
    assert batch.batch_size == torch.Size([4])
    assert batch.device == torch.device("cpu")
    # Each sampled reward matches its state row (rows stay aligned).
    assert torch.equal(batch["state"][:, 0], batch["reward"].reshape(-1))


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("0.5.0", True),
        ("0.15.3", True),
        ("0.15.10", True),
        ("0.4.9", False),
        ("0.16.0", False),
        ("0.16.0rc1", False),
        ("1.0.0", False),
        ("", False),
        ("weird", False),
    ],
)
def test_supported_range_by_major_minor(version: str, inside: bool) -> None:
    assert compat.in_supported_range(version) is inside
    if version and version[0].isdigit():
        spec = Requirement(f"tensordict{compat.SUPPORTED}").specifier
        assert spec.contains(Version(version), prereleases=True) is inside
