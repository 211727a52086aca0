"""Scheduler plugins shared by collections, and removed with the last one that uses them.

daskcollect installs a few plugins on the scheduler (graceful retirement, worker
joins, the dashboard's monitor). A scheduler may serve several collections at
once, from one driver or several, and it is often a cluster shared with other
work: a plugin must be there while any collection uses it and gone, with what
it changed undone, once none does.

Each collection holds a *lease* on each plugin. :func:`acquire` installs the
plugin if the scheduler has none of that name and records the lease;
:func:`release_lease` drops it, and the last lease out closes the plugin (its
``close`` undoes what its ``start`` changed) and removes it. A driver that
dies without releasing is covered too: when its ``Client`` disconnects, the
plugin drops that client's leases the same way. Both run on the scheduler's
event loop (``Client.run_on_scheduler``), so an acquire and a release never
interleave.
"""
