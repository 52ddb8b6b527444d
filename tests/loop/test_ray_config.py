"""The loop's ``rollout.ray`` keys: off by default, checked when on, resumable."""

from __future__ import annotations

import re

import pytest

from replaystore.errors import ConfigError
from replaystore.loop.config import LoopConfig, resume_changes
from replaystore.rollouts.ray_rollout import RayOptions


def test_ray_is_off_by_default() -> None:
    assert LoopConfig.from_mapping({})["rollout"]["ray"]["address"] is None


def test_a_ray_section_becomes_the_drivers_options() -> None:
    ray = {"address": "auto", "actors": 4, "placement": "pack", "resources": {"browser": 1}}
    config = LoopConfig.from_mapping({"rollout": {"ray": ray}})
    options = RayOptions.from_mapping(config["rollout"]["ray"])
    assert (options.address, options.actors, options.browsers_per_actor) == ("auto", 4, 2)
    assert options.resources == {"browser": 1}


@pytest.mark.parametrize(
    ("ray", "message"),
    [
        ({"address": "auto", "actors": 0}, "ray actors must be an int >= 1"),
        ({"address": "auto", "placement": "far"}, "placement must be spread or pack"),
        ({"address": "auto", "resources": {"gpu": -1}}, "resources must map names to numbers"),
        ({"address": 6379}, "rollout.ray.address must be a string"),
        ({"actor": 2}, "unknown key rollout.ray.'actor'"),
    ],
)
def test_a_bad_ray_key_is_named(ray: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        LoopConfig.from_mapping({"rollout": {"ray": ray}})


def test_cdp_and_ray_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.cdp and rollout\.ray exclude each other"):
        LoopConfig.from_mapping({"rollout": {"cdp": ["http://x:9222"], "ray": {"address": "auto"}}})


def test_moving_the_rollouts_to_ray_on_resume_is_accepted() -> None:
    before = LoopConfig.from_mapping({}).resolved()
    after = LoopConfig.from_mapping({"rollout": {"ray": {"address": "auto"}}}).resolved()
    refused, accepted = resume_changes(before, after)
    assert not refused
    assert "rollout.ray.address" in accepted
