"""What runs on the workers: the collector actor, its spec and rollout record, the plugin, the recipe.

- :mod:`~daskcollect.worker.rollout`: ``ActorSpec`` (how to start one actor)
  and ``Rollout`` (what one rollout call returns);
- :mod:`~daskcollect.worker.actor`: ``CollectorActor``, the long-lived object
  around a TorchRL collector;
- :mod:`~daskcollect.worker.plugin`: ``WorkerSetup``, the WorkerPlugin;
- :mod:`~daskcollect.worker.recipe`: ``CollectorRecipe``, what a worker needs
  to build its TorchRL collector.

Nothing is imported here: a worker unpickling the plugin imports only the
plugin's module, and the plugin imports torch and TorchRL off the event loop.
"""
