"""``py_modules=``: env constructors from the user's own modules, which only the driver has."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import uuid

import pytest
from makers import make_cartpole

from daskcollect import DaskCollector
from daskcollect.errors import CollectorBuildError, ConfigurationError

ENV_SOURCE = textwrap.dedent(
    """
    from torchrl.envs import GymEnv


    def make_env():
        return GymEnv("CartPole-v1")
    """
)


def driver_only_module(folder, package: bool = False):
    """A module (or a package with a submodule) importable here only: not on any worker's sys.path."""
    name = f"claims_dyn_{uuid.uuid4().hex[:8]}"
    if package:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text("")
        (folder / name / "envs.py").write_text(ENV_SOURCE)
        paths = [(name, folder / name / "__init__.py"), (f"{name}.envs", folder / name / "envs.py")]
    else:
        (folder / f"{name}.py").write_text(ENV_SOURCE)
        paths = [(name, folder / f"{name}.py")]
    for module_name, path in paths:
        search = [str(path.parent)] if path.name == "__init__.py" else None
        spec = importlib.util.spec_from_file_location(module_name, path, submodule_search_locations=search)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[paths[-1][0]]


@pytest.fixture
def drop_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("claims_dyn_"):
            del sys.modules[name]


def test_missing_module_names_it_and_the_fix(cluster, tmp_path, drop_modules):
    module = driver_only_module(tmp_path)
    with pytest.raises(CollectorBuildError) as info:
        DaskCollector(module.make_env, frames_per_batch=20, total_frames=40, client=cluster.scheduler_address)
    message = str(info.value)
    assert f"cannot import module {module.__name__!r}" in message
    assert f"py_modules=[{module.__name__!r}]" in message and str(tmp_path) in message


@pytest.mark.parametrize("package", [False, True], ids=["file", "package"])
def test_py_modules_ships_a_driver_only_module(cluster, tmp_path, drop_modules, package):
    module = driver_only_module(tmp_path, package=package)
    top = module.__name__.split(".")[0]
    with DaskCollector(
        module.make_env, frames_per_batch=20, total_frames=80, client=cluster.scheduler_address,
        py_modules=[top if package else module],
    ) as collector:  # fmt: skip
        batches = list(collector)
        imported = collector.client.run(lambda: top in sys.modules)
    assert sum(b.numel() for b in batches) == 80
    assert set(imported.values()) == {True}


def test_unknown_py_module_fails_before_connecting():
    with pytest.raises(ConfigurationError, match="'no_such_module_here' cannot be found"):
        DaskCollector(
            make_cartpole, frames_per_batch=10, client="tcp://127.0.0.1:9", py_modules=["no_such_module_here"]
        )


def test_py_modules_path_must_be_a_module(tmp_path):
    (tmp_path / "data.txt").write_text("")
    with pytest.raises(ConfigurationError, match="neither a .py file nor a package folder"):
        DaskCollector(
            make_cartpole, frames_per_batch=10, client="tcp://127.0.0.1:9", py_modules=[tmp_path / "data.txt"]
        )
