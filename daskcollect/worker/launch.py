"""Starts a collector actor from bytes that the scheduler does not unpickle.

Dask's scheduler unpickles every task it is given. Submitted as
``CollectorActor(spec, recipe)``, each collector would make it import the actor's
module, and with it torch, tensordict and TorchRL: 3 s of CPU and 300 MB on the
scheduler, which in a private cluster is a child of the driver that has no other
use for them. Here the task is this module's light function, and the spec
travels pickled.
"""

from __future__ import annotations

import pickle
from typing import Any


def start_collector(spec: bytes, recipe: bytes) -> Any:
    """Builds the ``CollectorActor`` (the task's result is the actor).

    Args:
        spec: The pickled ``ActorSpec``.
        recipe: The pickled ``CollectorRecipe`` (see ``CollectorActor``).
    """
    from daskcollect.worker.actor import CollectorActor

    return CollectorActor(pickle.loads(spec), recipe)
