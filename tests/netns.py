"""Simulated hosts for tests and benchmarks: Linux network namespaces joined by a bridge.

Each host is a network namespace with its own address in a private /24,
linked by a veth pair to a bridge in the caller's namespace, so the caller (the
driver) reaches every host over real TCP, and the hosts reach each other through
the bridge. Links can be shaped (``tc``: a bandwidth cap, and latency where the
kernel has ``sch_netem``) and cut. Everything made is removed on close, even
after a failure. Needs root and iproute2.

    with SimulatedHosts(["sched", "w1"]) as hosts:
        address = hosts.scheduler("sched")
        hosts.workers("w1", address, n=2)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

#: Environment for the processes on the hosts (added to this process's).
HOST_ENV = {"PYTHONWARNINGS": "ignore"}

#: A scheduler environment that notices a worker cut off within seconds (Dask's default waits minutes).
FAST_FAILURE_ENV = {
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "5s",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
}


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=True, capture_output=True, timeout=30, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    try:
        probe = f"dc-probe-{os.getpid()}"  # another suite on this machine may probe at the same time
        _sh("ip", "netns", "add", probe)
        _sh("ip", "netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    return None


def has_netem() -> bool:
    """Whether the kernel has ``sch_netem`` (latency); without it only the rate can be capped."""
    with SimulatedHosts(["probe"], subnet="10.214.0", bridge=f"dcp{os.getpid()}"[:15]) as hosts:
        try:
            hosts.run(
                "probe", "tc", "qdisc", "add", "dev", hosts.inner["probe"], "root", "netem", "delay", "1ms"
            )
        except subprocess.CalledProcessError:
            return False
    return True


class SimulatedHosts:
    """Hosts ``names`` as namespaces on one bridge (a context manager; ``close()`` is idempotent).

    Args:
        names: The hosts; each gets ``<subnet>.<10 + i>``.
        subnet: The first three octets of the hosts' /24 (the bridge takes ``.1``).
        bridge: The bridge's name (one rig per name at a time); default: one named after this process,
            so that suites running side by side on one machine do not share it.

    Attributes:
        addresses: Host name to IP address.
        links: Host name to its veth on the bridge's side (``cut`` takes it down).
        inner: Host name to its veth inside its namespace.
    """

    def __init__(self, names: Sequence[str], subnet: str = "10.213.0", bridge: str | None = None):
        tag = str(os.getpid() % 10000)
        self.names, self.subnet, self.bridge = list(names), subnet, bridge or f"dcbr{tag}"
        self.namespaces = {h: f"dc-{h}-{tag}" for h in self.names}
        self.addresses = {h: f"{subnet}.{10 + i}" for i, h in enumerate(self.names)}
        self.links = {h: f"dch{i}{tag}"[:15] for i, h in enumerate(self.names)}
        self.inner = {h: f"dcn{i}{tag}"[:15] for i, h in enumerate(self.names)}
        self._made: list[str] = []
        self._bridge_made = False
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> SimulatedHosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for h in self.names:
            ns, outer, inner = self.namespaces[h], self.links[h], self.inner[h]
            _sh("ip", "netns", "add", ns)
            self._made.append(ns)
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _sh("ip", "link", "set", outer, "master", self.bridge)
            _sh("ip", "link", "set", outer, "up")
            _sh("ip", "link", "set", inner, "netns", ns)
            self.run(h, "ip", "addr", "add", f"{self.addresses[h]}/24", "dev", inner)
            self.run(h, "ip", "link", "set", inner, "up")
            self.run(h, "ip", "link", "set", "lo", "up")

    # --- commands on the hosts ------------------------------------------------
    def run(self, host: str, *cmd: str) -> subprocess.CompletedProcess:
        """Runs ``cmd`` in ``host``'s namespace and waits (30 s at most)."""
        return _sh("ip", "netns", "exec", self.namespaces[host], *cmd)

    def spawn(self, host: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts ``python -m <args>`` on ``host`` in its own process group (killed on close)."""
        cmd = ["ip", "netns", "exec", self.namespaces[host], sys.executable, "-m", *args]
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **HOST_ENV, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def scheduler(self, host: str, port: int = 8786, env: dict[str, str] | None = None) -> str:
        """Starts a ``dask scheduler`` on ``host``; returns its address (it takes about 2 s to listen)."""
        self.spawn(host, "distributed.cli.dask_scheduler", "--host", self.addresses[host],
                   "--port", str(port), "--no-dashboard", env=env)  # fmt: skip
        time.sleep(2)
        return f"tcp://{self.addresses[host]}:{port}"

    def workers(self, host: str, scheduler: str, n: int = 1, resources: str | None = None) -> None:
        """Starts ``n`` single-threaded ``dask worker`` processes (no nanny) on ``host``."""
        extra = ["--resources", resources] if resources else []
        for _ in range(n):
            self.spawn(host, "distributed.cli.dask_worker", scheduler, "--host", self.addresses[host],
                       "--nthreads", "1", "--no-dashboard", "--no-nanny", *extra)  # fmt: skip

    # --- links --------------------------------------------------------------
    def shape(self, qdisc: Sequence[str] | None) -> None:
        """Puts ``qdisc`` (e.g. ``["tbf", "rate", "1gbit", ...]``) on every host's egress and on the
        bridge's (the caller's egress), or removes it with ``None``."""
        devices = [(h, self.inner[h]) for h in self.names] + [(None, self.bridge)]
        for host, dev in devices:
            cmd = ["tc", "qdisc", "replace" if qdisc else "del", "dev", dev, "root", *(qdisc or [])]
            if host is None:
                subprocess.run(cmd, check=qdisc is not None, capture_output=True, timeout=30)
            elif qdisc:
                self.run(host, *cmd)
            else:
                with contextlib.suppress(subprocess.CalledProcessError):
                    self.run(host, *cmd)

    def cut(self, host: str) -> None:
        """Takes ``host``'s link down: it drops off the network, its processes keep running."""
        _sh("ip", "link", "set", self.links[host], "down")

    def close(self) -> None:
        """Kills the hosts' processes and removes the namespaces and the bridge."""
        procs, self._procs = self._procs, []
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        made, self._made = self._made, []
        for host in self.names:  # at once: a namespace's own links go only when the kernel gets to it
            subprocess.run(["ip", "link", "del", self.links[host]], capture_output=True, timeout=30)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self._bridge_made:
            self._bridge_made = False
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
