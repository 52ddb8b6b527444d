"""Safe import of WebGym .pt iteration files: components mapped, anything else refused."""

from __future__ import annotations

import datetime
import io
import os
import pickle
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import SchemaError, StorageError, TrajectoryError, UnsafeFileError
from replaystore.trajectories import components as ours
from replaystore.trajectories.storage import TrajectoryStorage
from replaystore.trajectories.webgym_import import (
    SafeUnpickler,
    import_webgym,
    load_webgym_file,
    load_webgym_payload,
    webgym_file_iteration,
)

MODULE = "webgym.data.components"


# Stand-ins with WebGym's constructors (webgym/data/components.py): plain classes that
# pickle their __dict__.
class Task:
    def __init__(
        self,
        task_name,
        domain,
        subdomain,
        website,
        difficulty,
        evaluator_reference,
        reference_answer,
        attempt_level=0,
        task_id=None,
        max_steps=None,
        trajectory_index=None,
    ):
        self.task_name = task_name
        self.domain = domain
        self.subdomain = subdomain
        self.website = website
        self.difficulty = difficulty
        self.evaluator_reference = evaluator_reference
        self.reference_answer = reference_answer
        self.attempt_level = attempt_level
        self.task_id = task_id
        self.max_steps = max_steps
        self.trajectory_index = trajectory_index


class Observation:
    def __init__(self, task, image_path, ac_tree, submit=None, page_metadata=None):
        self.task = task
        self.image_path = image_path
        self.ac_tree = ac_tree
        self.page_metadata = page_metadata or {}


class Action:
    def __init__(self, action, action_string):
        self.action = action
        self.action_string = action_string


class Response:
    def __init__(self, raw_response, answering_tokens, raw_prompt=""):
        self.raw_response = raw_response
        self.answering_tokens = answering_tokens
        self.raw_prompt = raw_prompt


class Reward:
    def __init__(
        self, reward, evaluation, is_blocked=False, submit=False, submission_judgment=None
    ):
        self.reward = reward
        self.evaluation = evaluation
        self.is_blocked = is_blocked
        self.submit = submit
        self.submission_judgment = submission_judgment


PLAIN = {"Task": Task, "Observation": Observation, "Action": Action, "Response": Response}
PLAIN["Reward"] = Reward


def _reduce_with_args(self):
    # What a WebGym version with __reduce__ would do: rebuild by calling the constructor.
    return (type(self), tuple(self._args))


def reduce_variant() -> dict[str, type]:
    """Subclasses that pickle as ``cls(*constructor_args)`` (REDUCE with arguments)."""
    out = {}
    for name, base in PLAIN.items():

        def init(self, *args, _base=base, **kwargs):
            assert not kwargs
            self._args = args
            _base.__init__(self, *args)

        out[name] = type(name, (base,), {"__init__": init, "__reduce__": _reduce_with_args})
    return out


def setstate_variant() -> dict[str, type]:
    """Subclasses whose __reduce__ gives (cls, (), state) and restore via __setstate__."""
    out = {}
    for name, base in PLAIN.items():

        def reduce(self):
            return (type(self), (), dict(vars(self)))

        def setstate(self, state):
            self.__dict__.update(state)

        def new_init(self, *args, _base=base, **kwargs):
            if args or kwargs:
                _base.__init__(self, *args, **kwargs)

        out[name] = type(
            name,
            (base,),
            {"__init__": new_init, "__reduce__": reduce, "__setstate__": setstate},
        )
    return out


def dataclass_variant() -> dict[str, type]:
    """A WebGym whose components are slotted dataclasses (state pickled as a field list)."""

    @dataclass(slots=True)
    class DTask:
        task_name: Any
        domain: Any
        subdomain: Any
        website: Any
        difficulty: Any
        evaluator_reference: Any
        reference_answer: Any
        attempt_level: Any = 0
        task_id: Any = None
        max_steps: Any = None
        trajectory_index: Any = None

    @dataclass(slots=True)
    class DObservation:
        task: Any
        image_path: Any
        ac_tree: Any
        page_metadata: Any = None

    @dataclass(slots=True)
    class DAction:
        action: Any
        action_string: Any

    @dataclass(slots=True)
    class DResponse:
        raw_response: Any
        answering_tokens: Any
        raw_prompt: Any = ""

    @dataclass(slots=True)
    class DReward:
        reward: Any
        evaluation: Any
        is_blocked: Any = False
        submit: Any = False
        submission_judgment: Any = None

    return {
        "Task": DTask,
        "Observation": DObservation,
        "Action": DAction,
        "Response": DResponse,
        "Reward": DReward,
    }


def install_fake_webgym(monkeypatch, classes: dict[str, type]) -> None:
    """Register ``classes`` as ``webgym.data.components`` so torch.save can pickle them."""
    module = types.ModuleType(MODULE)
    for name, cls in classes.items():
        cls.__module__ = MODULE
        cls.__qualname__ = name
        cls.__name__ = name
        setattr(module, name, cls)
    package = types.ModuleType("webgym")
    data = types.ModuleType("webgym.data")
    data.components = module
    package.data = data
    monkeypatch.setitem(sys.modules, "webgym", package)
    monkeypatch.setitem(sys.modules, "webgym.data", data)
    monkeypatch.setitem(sys.modules, MODULE, module)


def remove_fake_webgym() -> None:
    for name in ("webgym", "webgym.data", MODULE):
        sys.modules.pop(name, None)


def webgym_step(classes: dict[str, type], i: int, **extra: Any) -> dict[str, Any]:
    C = classes
    task = C["Task"]("Buy socks", "Lifestyle", "Shopping", "shop.example", 2, [{"f": 1}], "ok")
    # WebGym's Observation takes a deprecated ``submit`` before page_metadata; a dataclass
    # version would not.
    submit = () if hasattr(C["Observation"], "__dataclass_fields__") else (None,)
    meta = {"url": f"https://shop/{i}"}
    step = {
        "observation": C["Observation"](task, f"/shots/{i}.png", f"[1] link {i}", *submit, meta),
        "action": C["Action"]({"key": "click", "element": i}, f"click [{i}]"),
        "response": C["Response"](f"Action: click [{i}]", {"action": f"click [{i}]"}, "[]"),
        "reward": C["Reward"](float(i == 1), {"judge": "x"}, False, i == 1, None),
    }
    step.update(extra)
    return step


def expected_step(i: int) -> dict[str, Any]:
    task = ours.Task("Buy socks", "Lifestyle", "Shopping", "shop.example", 2, [{"f": 1}], "ok")
    return {
        "observation": ours.Observation(
            task, f"/shots/{i}.png", f"[1] link {i}", {"url": f"https://shop/{i}"}
        ),
        "action": ours.Action({"key": "click", "element": i}, f"click [{i}]"),
        "response": ours.Response(f"Action: click [{i}]", {"action": f"click [{i}]"}, "[]"),
        "reward": ours.Reward(float(i == 1), {"judge": "x"}, False, i == 1, None),
    }


def save_webgym_file(path: Path, monkeypatch, classes: dict[str, type], payload_fn) -> Path:
    install_fake_webgym(monkeypatch, classes)
    torch.save(payload_fn(classes), path)
    remove_fake_webgym()
    return path


@pytest.mark.parametrize(
    "variant",
    [lambda: PLAIN, reduce_variant, setstate_variant, dataclass_variant],
    ids=["plain", "reduce-args", "setstate", "slots-dataclass"],
)
def test_webgym_file_loads_into_our_components_without_webgym_installed(
    tmp_path, monkeypatch, variant
):
    def payload(C):
        return {
            "trajectories": [[webgym_step(C, 0), webgym_step(C, 1)], None, [webgym_step(C, 2)]],
            "metadata": {"iteration": 3, "timestamp": "2026-01-01T00:00:00"},
        }

    path = save_webgym_file(
        tmp_path / "train_trajectories.pt.iteration3", monkeypatch, variant(), payload
    )
    assert "webgym" not in sys.modules and MODULE not in sys.modules
    trajectories = load_webgym_file(path)
    assert trajectories == [[expected_step(0), expected_step(1)], [expected_step(2)]]
    assert isinstance(trajectories[0][0]["observation"].task, ours.Task)


def test_old_list_format_and_optional_step_keys(tmp_path, monkeypatch):
    def payload(C):
        return [
            [
                webgym_step(
                    C,
                    0,
                    same_as_next_screenshot=True,
                    trajectory_metadata={"keypoint_step_ids": [1]},
                ),
                webgym_step(C, 1),
            ]
        ]

    path = save_webgym_file(tmp_path / "old.pt", monkeypatch, PLAIN, payload)
    ((first, second),) = load_webgym_file(path)
    assert first["same_as_next_screenshot"] is True
    assert first["trajectory_metadata"] == {"keypoint_step_ids": [1]}
    assert "same_as_next_screenshot" not in second


def test_tensors_numpy_scalars_bytes_sets_and_datetimes_become_plain_values(tmp_path, monkeypatch):
    def payload(C):
        step = webgym_step(C, 1)
        step["response"].answering_tokens = {"ids": torch.tensor([[1, 2], [3, 4]])[:, 1]}
        step["reward"].reward = np.float64(1.0)
        step["reward"].evaluation = {
            "raw": b"\x00\xffjudge",
            "tags": {"a", "b"},
            "scores": torch.tensor([0.5, 0.25], dtype=torch.float32),
            "empty": torch.zeros(0),
            "count": np.int32(7),
        }
        return {
            "trajectories": [[step]],
            "metadata": {"when": datetime.datetime(2026, 1, 2, 3, 4, 5)},
        }

    path = save_webgym_file(tmp_path / "t.pt", monkeypatch, PLAIN, payload)
    payload_back = load_webgym_payload(path)
    step = payload_back["trajectories"][0][0]
    assert step["response"].answering_tokens == {"ids": [2, 4]}
    assert step["reward"].reward == 1.0 and type(step["reward"].reward) is float
    assert step["reward"].evaluation == {
        "raw": b"\x00\xffjudge",
        "tags": {"a", "b"},
        "scores": [0.5, 0.25],
        "empty": [],
        "count": 7,
    }
    assert payload_back["metadata"]["when"] == datetime.datetime(2026, 1, 2, 3, 4, 5)


class Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_calling_os_system_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    marker = tmp_path / "marker"

    def payload(C):
        step = webgym_step(C, 0)
        step["response"].answering_tokens = {"action": Evil(marker)}
        return {"trajectories": [[step]], "metadata": {}}

    path = save_webgym_file(tmp_path / "evil.pt", monkeypatch, PLAIN, payload)
    with pytest.raises(UnsafeFileError, match=r"(posix|os|nt)\.system"):
        load_webgym_file(path)
    assert not marker.exists()


def test_top_level_evil_object_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save(Evil(marker), path)
    with pytest.raises(UnsafeFileError, match=r"evil\.pt"):
        load_webgym_payload(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("builtins", "eval"),
        ("__builtin__", "getattr"),
        ("subprocess", "Popen"),
        ("torch", "load"),
        ("torch.serialization", "load"),
        ("webgym.data.components", "ReplayBuffer"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("copyreg", "__newobj__"),
    ],
)
def test_any_global_outside_the_allow_list_is_refused(module, name):
    data = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."
    with pytest.raises(UnsafeFileError, match=rf"{module}\.{name}"):
        SafeUnpickler(io.BytesIO(data), source="crafted.pkl").load()


def test_reconstructor_is_limited_to_webgym_records():
    data = b"\x80\x02ccopyreg\n_reconstructor\ncbuiltins\nset\ncbuiltins\nobject\nN\x87R."
    with pytest.raises(UnsafeFileError, match="_reconstructor"):
        SafeUnpickler(io.BytesIO(data)).load()


def test_protocol_0_webgym_pickle_loads(monkeypatch):
    install_fake_webgym(monkeypatch, PLAIN)
    data = pickle.dumps(webgym_step(PLAIN, 1)["action"], protocol=0)
    remove_fake_webgym()
    assert b"copy_reg" in data
    record = SafeUnpickler(io.BytesIO(data)).load()
    from replaystore.trajectories.webgym_import import _to_components

    assert _to_components(record, "p0") == ours.Action({"key": "click", "element": 1}, "click [1]")


def test_unknown_component_field_is_a_clear_error(tmp_path, monkeypatch):
    def payload(C):
        step = webgym_step(C, 0)
        step["observation"].task.priority = "high"
        return {"trajectories": [[step]]}

    path = save_webgym_file(tmp_path / "t.pt", monkeypatch, PLAIN, payload)
    with pytest.raises(SchemaError, match=r"t\.pt.*webgym\.data\.components\.Task.*'priority'"):
        load_webgym_file(path)


def test_deprecated_observation_submit_argument_is_dropped(tmp_path, monkeypatch):
    classes = reduce_variant()

    def payload(C):
        step = webgym_step(C, 0)
        task = step["observation"].task
        step["observation"] = C["Observation"](task, "/s.png", "tree", True, {"title": "t"})
        return {"trajectories": [[step]]}

    path = save_webgym_file(tmp_path / "t.pt", monkeypatch, classes, payload)
    observation = load_webgym_file(path)[0][0]["observation"]
    assert observation == ours.Observation(observation.task, "/s.png", "tree", {"title": "t"})


def test_step_with_unknown_key_names_trajectory_and_step(tmp_path, monkeypatch):
    def payload(C):
        return {
            "trajectories": [[webgym_step(C, 0)], [webgym_step(C, 1), webgym_step(C, 2, done=1)]]
        }

    path = save_webgym_file(tmp_path / "t.pt", monkeypatch, PLAIN, payload)
    with pytest.raises(TrajectoryError, match=r"trajectory 1, step 1.*'done'"):
        load_webgym_file(path)


def test_file_that_is_not_a_torch_zip_is_a_storage_error(tmp_path):
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(StorageError, match="not a torch zip"):
        load_webgym_file(raw)
    with pytest.raises(StorageError, match="not found"):
        load_webgym_file(tmp_path / "missing.pt")
    empty_zip = tmp_path / "empty.pt"
    with zipfile.ZipFile(empty_zip, "w") as archive:
        archive.writestr("archive/version", "3")
    with pytest.raises(StorageError, match=r"data\.pkl"):
        load_webgym_file(empty_zip)


def test_payload_without_trajectories_is_reported(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"metadata": {}}, path)
    with pytest.raises(StorageError, match="no 'trajectories' key"):
        load_webgym_file(path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("train_trajectories.pt.iteration5", (5, None)),
        ("test_trajectories.pt.iteration12_rank_3", (12, 3)),
        ("trajectories.pt", None),
    ],
)
def test_iteration_and_rank_from_webgym_file_names(name, expected):
    assert webgym_file_iteration(Path("/logs") / name) == expected


# import_webgym: into replaystore's iteration storage


def write_iteration(path: Path, monkeypatch, steps_per_trajectory: list[int], **meta) -> Path:
    def payload(C):
        trajectories = [[webgym_step(C, i) for i in range(n)] for n in steps_per_trajectory]
        return {"trajectories": trajectories, "metadata": meta}

    path.parent.mkdir(parents=True, exist_ok=True)
    return save_webgym_file(path, monkeypatch, PLAIN, payload)


@pytest.fixture
def webgym_dir(tmp_path, monkeypatch) -> Path:
    """WebGym's train_trajectories/ with iterations 1 and 2 (2 also as a leftover rank file)."""
    root = tmp_path / "logs" / "train_trajectories"
    write_iteration(root / "train_trajectories.pt.iteration1", monkeypatch, [2, 1], iteration=1)
    write_iteration(
        root / "train_trajectories.pt.iteration2",
        monkeypatch,
        [3],
        iteration=2,
        when=datetime.datetime(2026, 1, 1),
    )
    write_iteration(root / "train_trajectories.pt.iteration2_rank_0", monkeypatch, [3])
    return root


def test_import_directory_writes_each_iteration_to_storage(tmp_path, webgym_dir):
    storage = TrajectoryStorage(tmp_path / "store", keep_page_metadata=True)
    done = import_webgym(webgym_dir, storage)
    assert [(d.source.name, d.iteration, d.rank, d.trajectories, d.steps) for d in done] == [
        ("train_trajectories.pt.iteration1", 1, 0, 2, 3),
        ("train_trajectories.pt.iteration2", 2, 0, 1, 3),
    ]
    assert all(d.written.is_file() for d in done)
    assert storage.iterations() == [1, 2]
    loaded = storage.load_all()
    assert [len(t) for t in loaded] == [2, 1, 3]
    for trajectory in loaded:
        for i, step in enumerate(trajectory):
            for key in ("observation", "action", "response", "reward"):
                assert step[key] == expected_step(i)[key]
    (meta,) = storage.metadata(2)
    assert meta["imported_from"] == str(webgym_dir / "train_trajectories.pt.iteration2")
    assert meta["webgym_metadata"] == {"iteration": 2, "when": "2026-01-01T00:00:00"}


def test_import_reports_progress_after_each_written_file(tmp_path, webgym_dir):
    calls = []

    def progress(count, total, imported):
        calls.append((count, total, imported.iteration, imported.written.is_file()))

    import_webgym(webgym_dir, TrajectoryStorage(tmp_path / "store"), progress=progress)
    assert calls == [(1, 2, 1, True), (2, 2, 2, True)]


def test_import_into_a_directory_path_and_numbering_of_unnamed_files(tmp_path, monkeypatch):
    a = write_iteration(tmp_path / "in" / "a.pt", monkeypatch, [1])
    b = write_iteration(tmp_path / "in" / "b.pt", monkeypatch, [2])
    named = write_iteration(tmp_path / "in" / "x.pt.iteration4_rank_1", monkeypatch, [1])
    done = import_webgym([a, named, b], tmp_path / "store")
    assert [(d.source.name, d.iteration, d.rank) for d in done] == [
        ("x.pt.iteration4_rank_1", 4, 1),
        ("a.pt", 5, 0),
        ("b.pt", 6, 0),
    ]
    assert TrajectoryStorage(tmp_path / "store").iterations() == [4, 5, 6]


def test_import_refuses_taken_or_clashing_iterations_before_writing(tmp_path, webgym_dir):
    store = tmp_path / "store"
    import_webgym(webgym_dir / "train_trajectories.pt.iteration2", store)
    before = sorted(p.name for p in store.iterdir())
    with pytest.raises(StorageError, match="already has iteration 2"):
        import_webgym(webgym_dir, store)
    clash = [webgym_dir / "train_trajectories.pt.iteration2"] * 2
    with pytest.raises(StorageError, match="both map to iteration 2, rank 0"):
        import_webgym(clash, tmp_path / "other")
    assert sorted(p.name for p in store.iterdir()) == before
    assert not (tmp_path / "other").exists()


def test_import_of_an_unsafe_file_writes_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "marker"

    def payload(C):
        step = webgym_step(C, 0)
        step["reward"].evaluation = Evil(marker)
        return {"trajectories": [[step]]}

    path = save_webgym_file(tmp_path / "x.pt.iteration1", monkeypatch, PLAIN, payload)
    with pytest.raises(UnsafeFileError):
        import_webgym(path, tmp_path / "store")
    assert not marker.exists()
    assert TrajectoryStorage(tmp_path / "store").iterations() == []
