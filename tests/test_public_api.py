"""Each package's exported names, locked.

``EXPORTS`` is the committed public surface: changing a package's ``__all__``
(adding, renaming or dropping a name) fails here until this list is updated in
the same change, so the API moves only on purpose. Also checked: every
exported name resolves, lazy export tables (``replaystore._lazy``) agree with
``__all__`` and with their ``TYPE_CHECKING`` imports (what type checkers see),
and every subpackage is listed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import replaystore

EXPORTS: dict[str, list[str]] = {
    "replaystore": ["ExperienceBuffer", "TrajectoryBuffer", "TransitionBuffer", "__version__"],
    "replaystore.cli": ["COMMANDS", "main"],
    "replaystore.demos": ["OPT_IN_PARTS", "PARTS"],
    "replaystore.formats": [],
    "replaystore.loop": [
        "DEFAULTS",
        "LoopConfig",
        "LoopInterrupted",
        "LoopRunner",
        "LoopStageError",
        "ToolsMissingError",
        "default_tools_dir",
        "find_tools",
        "load_config",
        "make_tiny_model",
        "run_loop",
    ],
    "replaystore.distributed": [
        "BatchingWriter",
        "RemoteActorError",
        "RemoteBuffer",
        "ShardedReplayBuffer",
    ],
    "replaystore.experience": [
        "Converter",
        "DataRow",
        "DefaultConverter",
        "ExpMeta",
        "Experience",
        "ExperienceBuffer",
        "FieldDecoders",
        "InMemoryStorage",
        "MultiProcMemoryStorage",
        "PostgresStorage",
        "QueryBuilder",
        "RandomSampler",
        "RandomTaskSample",
        "ReplayBuffer",
        "Sampler",
        "SqliteStorage",
        "Storage",
        "TaskBatchSampler",
        "open_storage",
    ],
    "replaystore.experience.storage": [
        "InMemoryStorage",
        "MultiProcMemoryStorage",
        "PostgresStorage",
        "SqliteStorage",
        "Storage",
        "open_storage",
    ],
    "replaystore.experience.storage.sqlite": ["SqliteStorage"],
    "replaystore.loop.stages": [
        "DATASET_NAME",
        "Outcome",
        "Recovery",
        "RunContext",
        "RunPaths",
        "Stage",
        "run_stage",
    ],
    "replaystore.pipeline": [
        "Blocklist",
        "BlocklistManager",
        "DEFAULT_LEVEL_WEIGHTS",
        "RolloutSampler",
        "TaskHistory",
        "TaskHistoryManager",
        "TaskSampler",
        "cleanup_old_iterations",
        "convert_messages_to_path_format",
        "encode_image_to_base64",
        "encode_image_to_file_url",
        "get_next_iteration_number",
        "get_trajectory_stats",
        "load_all_trajectories",
        "load_last_iteration_trajectories",
        "load_tasks",
        "normalize_domain",
        "save_trajectories_incremental",
    ],
    "replaystore.rollouts": [
        "ActionOutcome",
        "BrowserPool",
        "BrowserUnavailableError",
        "ChatCompletionsClient",
        "DEFAULT_MAX_STEPS",
        "Evaluator",
        "ExperimentLogger",
        "IterationResult",
        "JudgeVerdict",
        "LocalSuite",
        "OpenAIChatPolicy",
        "OpenAIJudge",
        "Policy",
        "PolicyRequest",
        "RolloutCollector",
        "ScriptedPolicy",
        "TaskOutcome",
        "WebAgent",
        "accessibility_tree",
        "difficulty_category",
        "execute_action",
        "find_chromium",
        "format_action",
        "parse_action",
    ],
    "replaystore.rollouts.sites": [
        "LocalSuite",
        "PLANS_FILE",
        "SITES",
        "TASKS_FILE",
        "load_plans",
        "localize_url",
    ],
    "replaystore.trajectories": [
        "Action",
        "BufferStats",
        "ConversationBuilder",
        "ExportReport",
        "JSONResponseParser",
        "Observation",
        "ReplayBuffer",
        "Response",
        "Reward",
        "SampleList",
        "Step",
        "TagParser",
        "Task",
        "ThinkActionParser",
        "TrajectoryBuffer",
        "TrajectoryStorage",
        "decompose_raw_response",
        "export_buffer",
        "export_llamafactory",
        "get_action_string",
        "import_webgym",
        "load_webgym_file",
        "step_from_dict",
        "step_to_dict",
        "trajectory_from_dicts",
        "trajectory_to_dicts",
    ],
    "replaystore.trajectories.files": [],
    "replaystore.transitions": [
        "Draw",
        "FieldSpec",
        "PrioritizedSampler",
        "RateLimitTimeout",
        "RateLimiter",
        "ReplayBuffer",
        "RingState",
        "Sampler",
        "SliceSampler",
        "TransitionBuffer",
        "UniformSampler",
        "nstep_fields",
    ],
    "replaystore.view": [
        "DEFAULT_HOST",
        "DEFAULT_PORT",
        "LOOPBACK_NAMES",
        "allowed_hosts",
        "build_app",
        "host_warning",
        "serve",
    ],
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_every_package_is_listed() -> None:
    packages = {
        m.name for m in pkgutil.walk_packages(replaystore.__path__, "replaystore.") if m.ispkg
    }
    missing = packages - set(EXPORTS)
    assert not missing, f"new package(s) {sorted(missing)}: add their __all__ to EXPORTS"
    assert set(EXPORTS) - {"replaystore"} <= packages, "EXPORTS lists a package that is gone"


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_all_is_the_committed_list(name: str) -> None:
    module = _module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    assert sorted(exported) == EXPORTS[name], (
        f"{name}.__all__ changed: added {sorted(set(exported) - set(EXPORTS[name]))}, "
        f"removed {sorted(set(EXPORTS[name]) - set(exported))}"
    )


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_exported_name_resolves_and_is_listed_by_dir(name: str) -> None:
    module = _module(name)
    for attr in module.__all__:
        # hasattr runs a lazy package's __getattr__: an ImportError propagates.
        assert hasattr(module, attr), f"{name}.{attr} is exported but does not resolve"
    assert set(module.__all__) <= set(dir(module))


def _lazy_packages() -> list[str]:
    return sorted(n for n in EXPORTS if isinstance(getattr(_module(n), "_LAZY", None), dict))


def _type_checking_imports(module: ModuleType) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in stmt.names)
    return names


def test_the_lazy_packages_are_the_expected_ones() -> None:
    assert _lazy_packages() == [
        "replaystore",
        "replaystore.pipeline",
        "replaystore.rollouts",
        "replaystore.trajectories",
    ]


@pytest.mark.parametrize("name", _lazy_packages())
def test_lazy_table_agrees_with_all_and_with_type_checking_imports(name: str) -> None:
    module = _module(name)
    lazy: dict[str, str] = module._LAZY
    assert set(lazy) <= set(module.__all__), (
        f"lazy names not exported: {set(lazy) - set(module.__all__)}"
    )
    # What type checkers see (the TYPE_CHECKING imports) is what resolves at run time.
    assert _type_checking_imports(module) == set(lazy)
    for attr, source in lazy.items():
        assert getattr(module, attr) is getattr(_module(source), attr), f"{name}.{attr}"
    # The exported names that are not lazy are defined by the package itself.
    for attr in set(module.__all__) - set(lazy):
        assert attr in vars(module), f"{name}.{attr} is neither lazy nor defined"


def test_unknown_lazy_name_is_an_attribute_error_naming_the_package() -> None:
    import replaystore.pipeline as pipeline

    with pytest.raises(AttributeError, match=r"'replaystore\.pipeline' has no attribute 'Nope'"):
        _ = pipeline.Nope
