#!/usr/bin/env bash
# A one-node SLURM on 127.0.0.1, for the tests and the "On SLURM" docs page (docs/slurm.md).
#
#   tools/slurm.sh start    writes the config if absent, starts munged, slurmctld and slurmd, waits for the node
#   tools/slurm.sh stop     stops the three daemons (jobs die with slurmd)
#   tools/slurm.sh status   exit 0 when the node answers, 1 otherwise
#
# Idempotent, runs as root without systemd (Debian's slurmctld slurmd slurm-client munge; Slurm 22.05).
# The node declares more CPUs than the machine has (SlurmdParameters=config_overrides), so that a few
# one-core jobs fit beside a job that asks for all of them. Two partitions let a job preempt another
# for real: "high" (PriorityTier=2) preempts "debug" (the default, PriorityTier=1) by cancelling its jobs:
# SIGTERM, then SIGKILL after GraceTime, as on a production cluster with PreemptMode=CANCEL.
# A config that this script did not write is never touched.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# written by daskcollect tools/slurm.sh"
LOCK=/run/daskcollect-slurm.lock
CPUS=${DASKCOLLECT_SLURM_CPUS:-8}
GRACE=${DASKCOLLECT_SLURM_GRACE:-30}

die() { echo "tools/slurm.sh: $*" >&2; exit 2; }

need() {
  [ "$(id -u)" = 0 ] || die "run as root (the daemons run as root here, without systemd)"
  for cmd in munged slurmctld slurmd sinfo; do
    command -v "$cmd" >/dev/null || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null \
      || die "$cmd is missing: apt-get install slurmctld slurmd slurm-client munge"
  done
  export PATH=$PATH:/usr/sbin
}

conf_text() {
  cat <<EOF
$MARK
ClusterName=daskcollect
SlurmctldHost=$(uname -n)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
KillWait=$GRACE
MinJobAge=60
NodeName=$(uname -n) NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=$GRACE
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2
EOF
}

# Writes the config if there is none, or rewrites ours if this script now writes another; returns 0 when
# it changed (running daemons must then restart: scontrol reconfigure does not apply every setting).
write_conf() {
  if [ -f "$CONF" ]; then
    head -1 "$CONF" | grep -qF "$MARK" || die "$CONF exists and was not written by this script; not touching it"
    if [ "$(conf_text)" = "$(cat "$CONF")" ]; then return 1; fi
  fi
  mkdir -p "$(dirname "$CONF")" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  conf_text >"$CONF"
}

node_up() { sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

start() {
  need
  if write_conf; then stop; fi
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
    chmod 400 /etc/munge/munge.key
    runuser -u munge -- munged 9>&-
  fi
  pgrep -x slurmctld >/dev/null || slurmctld 9>&-
  pgrep -x slurmd >/dev/null || slurmd 9>&-
  for _ in $(seq 1 60); do
    if node_up; then return 0; fi
    scontrol update nodename="$(uname -n)" state=resume >/dev/null 2>&1 || true
    sleep 0.5
  done
  die "the node did not come up within 30 s; see /var/log/slurm/"
}

stop() {
  export PATH=$PATH:/usr/sbin
  for daemon in slurmd slurmctld munged; do
    pkill -x "$daemon" 2>/dev/null || true
    for _ in $(seq 1 40); do pgrep -x "$daemon" >/dev/null || break; sleep 0.25; done
    pkill -9 -x "$daemon" 2>/dev/null || true
  done
}

exec 9>"$LOCK"
flock -w 60 9 || die "another tools/slurm.sh holds $LOCK"
case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) export PATH=$PATH:/usr/sbin; node_up ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
