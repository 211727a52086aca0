"""Where a collection runs: the cluster it is given or starts, and the questions it asks about its workers.

All of it runs on the driver, but :mod:`~daskcollect.deploy.scheduler_process`, the
process a private cluster's scheduler runs in.

- :mod:`~daskcollect.deploy.handle`: ``connect`` and :class:`ClusterHandle`
  (our ``Client``, the private cluster, the worker plugins registered);
- :mod:`~daskcollect.deploy.private`: the private cluster's layout;
- :mod:`~daskcollect.deploy.scheduler_process`: its scheduler's process;
- :mod:`~daskcollect.deploy.workers`: eligible and live workers, bounded;
- :mod:`~daskcollect.deploy.main_guard`: the ``__main__`` guard check;
- :mod:`~daskcollect.deploy.py_modules`: the user's modules uploaded to the workers.
"""
