"""Envs, policies and collectors that the tests and benchmarks use, imported by name.

They are not part of the installed package. Worker processes unpickle them by
reference, so they import this module too: the test session and the
benchmarks put this folder on ``PYTHONPATH`` for every process they start.
"""

from __future__ import annotations

import os
import time

import torch
from distributed import get_worker
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase


def make_cartpole():
    """A TorchRL ``GymEnv('CartPole-v1')``."""
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def make_pendulum():
    """A TorchRL ``GymEnv('Pendulum-v1')``."""
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")


def make_stateless_pendulum():
    """TorchRL's own ``PendulumEnv``: stateless, its whole state is in its tensordict."""
    from torchrl.envs import PendulumEnv

    return PendulumEnv()


#: Envs built by :func:`make_counted_pendulum` in this process.
BUILT = 0


def make_counted_pendulum():
    """:func:`make_stateless_pendulum`, counted in this process's :data:`BUILT`; it first sleeps
    ``DASKCOLLECT_TEST_ENV_BUILD_SECONDS`` (default 0), as an env that loads assets would."""
    global BUILT
    BUILT += 1
    time.sleep(float(os.environ.get("DASKCOLLECT_TEST_ENV_BUILD_SECONDS", "0")))
    return make_stateless_pendulum()


def envs_built(dask_worker=None) -> int:
    """:data:`BUILT` in this process (``Client.run`` it on the workers)."""
    return BUILT


class PendulumTorque(nn.Module):
    """A fixed linear torque on the pendulum's angle and speed: deterministic."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, th: torch.Tensor, thdot: torch.Tensor) -> torch.Tensor:
        features = torch.stack([th.cos(), th.sin(), thdot], -1)
        return self.linear(features).clamp(-2.0, 2.0)


def pendulum_policy(seed: int = 0) -> TensorDictModule:
    """A deterministic policy for :func:`make_stateless_pendulum`, the same for the same seed."""
    torch.manual_seed(seed)
    return TensorDictModule(PendulumTorque(), in_keys=["th", "thdot"], out_keys=["action"])


def make_env_reading_variable(name: str = "DASKCOLLECT_TEST_VAR"):
    """A CartPole env that fails unless the environment variable ``name`` is set."""
    if name not in os.environ:
        raise RuntimeError(f"{name} is not set on this worker")
    return make_cartpole()


def failing_env():
    """An env constructor that always raises."""
    raise ValueError("this env constructor always fails")


class ArgmaxPolicy(nn.Module):
    """A deterministic CartPole policy: one linear layer, one-hot argmax action."""

    def __init__(self, n_obs: int = 4, n_act: int = 2):
        super().__init__()
        self.linear = nn.Linear(n_obs, n_act)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits = self.linear(observation)
        return nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.int64)


class BallastPolicy(ArgmaxPolicy):
    """CartPole's argmax policy with ``nbytes`` of unused float32 weights (weight-transfer benchmarks)."""

    def __init__(self, nbytes: int):
        super().__init__()
        self.ballast = nn.Parameter(torch.zeros(max(nbytes // 4 - 10, 1)))


def cartpole_policy(seed: int = 0) -> TensorDictModule:
    """A deterministic CartPole policy with seeded weights."""
    torch.manual_seed(seed)
    return TensorDictModule(ArgmaxPolicy(), in_keys=["observation"], out_keys=["action"])


def constant_action_policy(action: int) -> TensorDictModule:
    """A CartPole policy that always picks ``action``, by its weights alone.

    The bias decides the action, so changing the weights on the driver changes
    the actions the workers take: a direct probe of weight updates.
    """
    module = ArgmaxPolicy()
    with torch.no_grad():
        module.linear.weight.zero_()
        module.linear.bias.copy_(torch.tensor([1.0, 0.0] if action == 0 else [0.0, 1.0]))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def set_constant_action(policy: TensorDictModule, action: int) -> None:
    """Changes a :func:`constant_action_policy` in place."""
    with torch.no_grad():
        policy.module.linear.bias.copy_(torch.tensor([1.0, 0.0] if action == 0 else [0.0, 1.0]))


def worker_port() -> int:
    """The port of the Dask worker whose context this code runs in.

    Raises:
        ValueError: Outside a worker's context (``distributed.get_worker()``'s "No worker found").
    """
    return int(get_worker().address.rsplit(":", 1)[1])


class WorkerPort(nn.Module):
    """Outputs, per frame, :func:`worker_port` as seen from inside the policy's forward."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.full(observation.shape[:-1], worker_port(), dtype=torch.int64)


def worker_context_policy(action: int = 0) -> TensorDictSequential:
    """:func:`constant_action_policy` (its first module) followed by :class:`WorkerPort`, which
    writes ``"worker_port"``: user policy code that needs ``distributed.get_worker()``."""
    return TensorDictSequential(
        constant_action_policy(action),
        TensorDictModule(WorkerPort(), in_keys=["observation"], out_keys=["worker_port"]),
    )


def make_cartpole_in_worker_context():
    """CartPole whose constructor and every step call ``distributed.get_worker()``: they raise
    outside a worker's context, or on another worker than the one that built the env."""
    port = worker_port()
    env = make_cartpole()
    original = env._step

    def _step(tensordict):
        if worker_port() != port:
            raise RuntimeError(f"the env built on worker port {port} steps on {worker_port()}")
        return original(tensordict)

    env._step = _step
    return env


def make_env_failing_after(steps: int = 50):
    """A CartPole env whose ``step`` raises once it has run ``steps`` steps."""
    env = make_cartpole()
    calls = {"n": 0}
    original = env._step

    def _step(tensordict):
        calls["n"] += 1
        if calls["n"] > steps:
            raise RuntimeError("step budget exhausted")
        return original(tensordict)

    env._step = _step
    return env


class PixelEnv(EnvBase):
    """Random ``size x size x 3`` uint8 frames; episodes end after ``max_steps`` steps."""

    def __init__(self, size: int = 84, max_steps: int = 50):
        super().__init__(batch_size=torch.Size([]))
        self.size, self.max_steps, self._t = size, max_steps, 0
        self._rng = torch.Generator().manual_seed(0)
        self.observation_spec = Composite(
            pixels=Bounded(0, 255, shape=(size, size, 3), dtype=torch.uint8), shape=()
        )
        self.action_spec = Categorical(2, shape=())
        self.reward_spec = Unbounded(shape=(1,))

    def _frame(self) -> torch.Tensor:
        return torch.randint(0, 256, (self.size, self.size, 3), dtype=torch.uint8, generator=self._rng)

    def _reset(self, tensordict=None):
        self._t = 0
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"pixels": self._frame(), "done": done, "terminated": done.clone()}, [])

    def _step(self, tensordict):
        self._t += 1
        done = torch.tensor([self._t >= self.max_steps])
        return TensorDict(
            {"pixels": self._frame(), "reward": torch.ones(1), "done": done, "terminated": done.clone()}, []
        )

    def _set_seed(self, seed: int | None):
        self._rng.manual_seed(int(seed or 0))


class StackedPixelEnv(PixelEnv):
    """Atari-sized observations, ``stack x size x size`` uint8 (about 28 KB; 56 KB a transition with
    ``next``), cheap to make (a copy of one random frame with a step counter in it), and a step that
    sleeps ``seconds``: the data path's cost shows, not the env's."""

    def __init__(self, seconds: float = 0.001, size: int = 84, stack: int = 4, max_steps: int = 200):
        super().__init__(size, max_steps)
        self.seconds = seconds
        self.observation_spec = Composite(
            pixels=Bounded(0, 255, shape=(stack, size, size), dtype=torch.uint8), shape=()
        )
        self._base = torch.randint(0, 256, (stack, size, size), dtype=torch.uint8, generator=self._rng)

    def _frame(self) -> torch.Tensor:
        frame = self._base.clone()
        frame[0, 0, 0] = self._t % 256
        return frame

    def _step(self, tensordict):
        time.sleep(self.seconds)
        return super()._step(tensordict)


class StackedPixelEnvMaker:
    """Builds a :class:`StackedPixelEnv` (picklable, for any worker)."""

    def __init__(self, seconds: float = 0.001):
        self.seconds = seconds

    def __call__(self) -> StackedPixelEnv:
        return StackedPixelEnv(self.seconds)


class VariableEnv(EnvBase):
    """An env whose observation says, at every reset and step, what the environment variable ``name`` reads
    in its process: the sum of the characters' codes of its value (0 when unset)."""

    def __init__(self, name: str = "DASKCOLLECT_TEST_WHO"):
        super().__init__(batch_size=torch.Size([]))
        self.name = name
        self.observation_spec = Composite(observation=Unbounded(shape=(1,)), shape=())
        self.action_spec = Categorical(2, shape=())
        self.reward_spec = Unbounded(shape=(1,))

    def _read(self) -> torch.Tensor:
        return torch.tensor([float(sum(map(ord, os.environ.get(self.name, ""))))])

    def _reset(self, tensordict=None):
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"observation": self._read(), "done": done, "terminated": done.clone()}, [])

    def _step(self, tensordict):
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict(
            {"observation": self._read(), "reward": torch.ones(1), "done": done, "terminated": done.clone()},
            [],
        )

    def _set_seed(self, seed: int | None):
        pass


def variable_code(value: str) -> float:
    """What :class:`VariableEnv` observes when its variable reads ``value``."""
    return float(sum(map(ord, value)))


def make_pixel_env(size: int = 84, max_steps: int = 50) -> PixelEnv:
    """A TorchRL env with ``size x size x 3`` uint8 pixel observations (no gym needed)."""
    return PixelEnv(size=size, max_steps=max_steps)


def make_env_failing_once(flag: str, steps: int = 30):
    """CartPole whose ``step`` raises once, in the first env to claim the ``flag`` file."""
    return _once(make_cartpole(), flag, steps, lambda: (_ for _ in ()).throw(RuntimeError("env broke once")))


def make_env_hanging_once(flag: str, steps: int = 30):
    """CartPole whose ``step`` hangs (sleeps an hour) once, in the first env to claim ``flag``."""
    import time

    return _once(make_cartpole(), flag, steps, lambda: time.sleep(3600))


def _once(env, flag: str, steps: int, action):
    """Runs ``action`` inside ``step`` after ``steps`` steps, in one env only (the flag file's claimer)."""
    calls = {"n": 0}
    original = env._step

    def _step(tensordict):
        calls["n"] += 1
        if calls["n"] == steps:
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL))  # atomic: one env claims it
            except FileExistsError:
                return original(tensordict)
            action()
        return original(tensordict)

    env._step = _step
    return env


class SleepEnvMaker:
    """Builds CartPole whose ``step`` sleeps ``seconds`` (an env that waits, e.g. on a simulator).

    Benchmarks use it to measure coordination overhead: the step costs wall
    time but almost no CPU. A picklable class, so that it reaches any worker.
    """

    def __init__(self, seconds: float = 0.01):
        self.seconds = seconds

    def __call__(self):
        import time

        env = make_cartpole()
        original, seconds = env._step, self.seconds

        def _step(tensordict):
            time.sleep(seconds)
            return original(tensordict)

        env._step = _step
        return env


class CountingPolicy(TensorDictModuleBase):
    """Acts with its weight (1.0 at first), as the policy of TorchRL's distributed-collector tests.

    Its action shows which weights a collector used: after ``weight.data += 1``
    and an update, the new batches act with 2.
    """

    def __init__(self, weight: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(weight))
        self.in_keys = []
        self.out_keys = ["action"]

    def forward(self, tensordict):
        tensordict.set("action", self.weight.expand(tensordict.shape).clone())
        return tensordict


def counting_policy_factory() -> CountingPolicy:
    """Builds a :class:`CountingPolicy` on the worker (``policy_factory=``)."""
    return CountingPolicy()


class PrebuiltCollector(Collector):
    """A TorchRL ``Collector`` that returns its first batch again, at once, every time.

    ``benchmarks/envelope.py`` passes it as ``collector_class`` (to
    ``DaskCollector`` and to ``MultiAsyncCollector``) to measure how many
    batches per second the path around a rollout sustains (the call, the
    transfer, the driver's bookkeeping) with no env in the way.
    """

    def iterator(self):
        batch = next(super().iterator())
        while True:
            yield batch  # the same object, as TorchRL's multiprocess collectors expect


def make_vmas_balance():
    """VMAS's "balance": 3 agents under one group key, 4 vectorized envs, continuous actions."""
    from torchrl.envs.libs.vmas import VmasEnv

    return VmasEnv(scenario="balance", num_envs=4, n_agents=3, continuous_actions=True, max_steps=50)


def make_mpe_spread():
    """PettingZoo's MPE "simple_spread" (mpe2), 2 agents, discrete actions, through TorchRL's wrapper."""
    import warnings

    from mpe2 import simple_spread_v3
    from torchrl.envs import PettingZooWrapper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's note on the env's spaces
        return PettingZooWrapper(simple_spread_v3.parallel_env(N=2, max_cycles=25), use_mask=False)
