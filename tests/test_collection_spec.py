"""The collection spec: keywords validated once, and RayCollector's keyword precedence in the recipes."""

from __future__ import annotations

import cloudpickle
import pytest
from helpers import collector_keywords
from makers import counting_policy_factory
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.envs.utils import ExplorationType

from daskcollect import ConfigurationError
from daskcollect.collection.spec import CollectionSpec
from daskcollect.settings import Settings


def keywords(**overrides) -> dict:
    return collector_keywords(**overrides)


def built(n: int = 2, **overrides) -> list[dict]:
    spec = CollectionSpec.from_keywords(Settings.load(), keywords(**overrides))
    return [cloudpickle.loads(blob).collector_kwargs for blob in spec.recipes(n)]


def test_top_level_keywords_override_collector_kwargs_as_in_ray():
    user = {"max_frames_per_traj": 50, "init_random_frames": 7, "reset_at_each_iter": True,
            "exploration_type": ExplorationType.DETERMINISTIC, "frames_per_batch": 3, "device": "cpu",
            "split_trajs": True, "trust_policy": True, "no_cuda_sync": True}  # fmt: skip
    (kwargs, _) = built(collector_kwargs=user, init_random_frames=100, sync=True)
    assert kwargs["max_frames_per_traj"] == -1  # RayCollector's default wins over collector_kwargs
    assert kwargs["init_random_frames"] == 50  # split over the 2 collectors
    assert kwargs["reset_at_each_iter"] is False
    assert kwargs["exploration_type"] == keywords()["exploration_type"]
    assert kwargs["frames_per_batch"] == 50 and kwargs["split_trajs"] is False
    assert kwargs["device"] is None  # the devices too, even unset
    assert kwargs["trust_policy"] is True and kwargs["no_cuda_sync"] is True  # these only fill gaps


def test_hooks_and_trajs_per_batch_only_fill_gaps():
    def hook():
        return None

    kwargs = built(n=1, pre_collect_hook=hook, trajs_per_batch=4, collector_kwargs={"trajs_per_batch": 2})[0]
    assert kwargs["pre_collect_hook"] is not None and kwargs["trajs_per_batch"] == 2


def test_a_factory_policy_in_multi_collectors_gets_torchrls_shared_memory_scheme():
    from torchrl.weight_update import SharedMemWeightSyncScheme

    kwargs = built(policy_factory=counting_policy_factory, collector_class=MultiSyncCollector)[0]
    assert isinstance(kwargs["weight_sync_schemes"]["policy"], SharedMemWeightSyncScheme)
    assert (
        "weight_sync_schemes"
        not in built(policy_factory=counting_policy_factory, collector_class=Collector)[0]
    )
    mine = {"policy": SharedMemWeightSyncScheme()}
    kept = built(policy_factory=counting_policy_factory, collector_class=MultiSyncCollector,
                 collector_kwargs={"weight_sync_schemes": mine})[0]  # fmt: skip
    assert set(kept["weight_sync_schemes"]) == {"policy"}


def test_identical_recipes_are_pickled_once():
    spec = CollectionSpec.from_keywords(Settings.load(), keywords())
    blobs = spec.recipes(3)
    assert blobs[0] is blobs[1] is blobs[2]


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_collectors": 0}, "num_collectors"),
        ({"num_workers_per_collector": 0}, "num_workers_per_collector"),
        ({"create_env_fn": 3}, "create_env_fn must be a callable"),
        ({"collector_class": "fast"}, "collector_class"),
    ],
)
def test_bad_keywords_are_refused_before_any_cluster(overrides, match):
    with pytest.raises(ConfigurationError, match=match):
        CollectionSpec.from_keywords(Settings.load(), keywords(**overrides))


def test_collectors_keep_the_env_as_built_unless_asked():
    """auto_register_policy_transforms=False by default (no TorchRL 0.14 FutureWarning); the user's choice wins."""

    def kwargs_of(**kw):
        spec = CollectionSpec.from_keywords(Settings.load(), collector_keywords(**kw))
        return cloudpickle.loads(spec.recipes(1)[0]).collector_kwargs

    assert kwargs_of()["auto_register_policy_transforms"] is False
    asked = kwargs_of(collector_kwargs={"auto_register_policy_transforms": True})
    assert asked["auto_register_policy_transforms"] is True
