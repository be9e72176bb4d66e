#!/bin/bash
# A real two-node SLURM cluster on this one machine, for the SLURM tests (tests/slurm/).
#   tests/slurm/cluster.sh up      start it (idempotent; as root); prints `export SLURM_CONF=...`
#   tests/slurm/cluster.sh down    stop exactly the daemons `up` started (by recorded pid)
# slurmctld and two slurmd (-N n1, -N n2), each slurmd in its own UTS + mount namespace so that inside
# a job `hostname` says n1 or n2 and both names resolve (127.0.0.11 / .12, on loopback); munge for
# authentication; no systemd, cgroups or accounting (no sacct: squeue and scontrol only). The packages
# (Debian's slurmctld slurmd slurm-client munge) are installed by .ci/run; `up` installs them too when apt
# can. Ports 6917 and 17101-2, so that it does not meet ../shared/tools/slurm-local's cluster.
set -euo pipefail
D=${TORCHDECK_SLURM_DIR:-/tmp/torchdeck-slurm}
CONF=$D/slurm.conf
export SLURM_CONF=$CONF

up_already() {
  [ -s "$D/slurmctld.pid" ] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null &&
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)')" = 2 ]
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return 0
  [ "$(id -u)" = 0 ] || { echo "SLURM is not installed and this is not root" >&2; return 1; }
  command -v apt-get >/dev/null || { echo "SLURM is not installed and there is no apt-get" >&2; return 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
}

start_munge() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create --force --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge; chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  cp /run/munge/munged.pid "$D/munged.pid"
}

write_conf() {
  printf '127.0.0.1 localhost %s\n127.0.0.11 n1\n127.0.0.12 n2\n' "$(hostname)" > "$D/hosts"
  # CPUs=4 per node on a 2-core machine (config_overrides: slurmd trusts this file), so that a job asking
  # for a few CPUs per rank is accepted; the nodes share the machine's cores anyway.
  cat > "$CONF" <<C
ClusterName=torchdeck
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=6917
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
SchedulerParameters=bf_interval=2,sched_interval=2
KillWait=5
Waittime=0
JobRequeue=1
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.11 Port=17101 CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.12 Port=17102 CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
C
}

up() {
  mkdir -p "$D"/{state,log,spool/n1,spool/n2}
  if up_already; then echo "export SLURM_CONF=$CONF"; return 0; fi
  install
  start_munge
  write_conf
  slurmctld -f "$CONF" -i
  if unshare --uts --mount --propagation private -- true 2>/dev/null; then
    for n in n1 n2; do  # slurmd daemonizes and keeps its namespaces
      unshare --uts --mount --propagation private -- bash -c \
        "hostname $n && mount --bind '$D/hosts' /etc/hosts && exec slurmd -f '$CONF' -N $n"
    done
  else  # no CAP_SYS_ADMIN: both nodes keep this host's name; the names resolve through /etc/hosts
    grep -q ' n1$' /etc/hosts || printf '127.0.0.11 n1\n127.0.0.12 n2\n' >> /etc/hosts
    for n in n1 n2; do slurmd -f "$CONF" -N $n; done
  fi
  for _ in $(seq 150); do up_already && break; sleep 0.2; done
  up_already || { echo "the local SLURM did not come up: $D/log" >&2; sinfo -N >&2 || true; return 1; }
  echo "export SLURM_CONF=$CONF"
}

down() {
  for f in "$D"/slurmd-n1.pid "$D"/slurmd-n2.pid "$D"/slurmctld.pid "$D"/munged.pid; do
    [ -s "$f" ] || continue; p=$(cat "$f"); kill "$p" 2>/dev/null && echo "stopped $(basename "$f" .pid) pid $p"
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    rm -f "$f"
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
