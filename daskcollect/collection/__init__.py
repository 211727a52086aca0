"""One collection on the driver: its spec, its resources, its engine and how rollouts become batches.

Runs on the driver.

- :mod:`~daskcollect.collection.options` and :mod:`~daskcollect.collection.spec`:
  the keywords, validated once into frozen options and recipes;
- :mod:`~daskcollect.collection.session`: the one owner of a collection's
  resources, opened in order and closed in reverse;
- :mod:`~daskcollect.collection.engine`: the collectors wanted against the
  collectors live, and the one failure policy;
- :mod:`~daskcollect.collection.pool`: the actors, their calls in flight and
  their completions;
- :mod:`~daskcollect.collection.iteration`: sync and async batches;
- :mod:`~daskcollect.collection.output`: a batch's rollouts into what the
  iterator yields;
- :mod:`~daskcollect.collection.background`, :mod:`~daskcollect.collection.checkpoint`,
  :mod:`~daskcollect.collection.memmap`, :mod:`~daskcollect.collection.polling`.
"""
