#!/usr/bin/env bash
# A throwaway single-node Slurm cluster for the peer benchmark (`python -m bench peer`),
# from Debian's slurm-wlm and munge packages (`apt-get install -y slurm-wlm munge`).
#
#   slurm-setup.sh start DIR   write DIR/slurm.conf, start munged, slurmctld and slurmd with
#                              every file under DIR, wait until the node is idle, and print
#                              SLURM_CONF=DIR/slurm.conf (export it for sbatch/squeue)
#   slurm-setup.sh stop DIR    stop the three daemons started by `start DIR`
#
# The node declares 64 CPUs whatever the machine has (SlurmdParameters=config_overrides),
# scheduling is backfill (sched/backfill, select/cons_tres with CR_CPU), there is no
# accounting, no cgroup plugin and no memory accounting, so a job costs what the control
# plane itself does. Run as root (the daemons and jobs run as root). Ports: SLURM_PEER_PORT
# (slurmctld, default 16817) and SLURM_PEER_PORT+1 (slurmd). Exit status 3: not installed.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

missing=()
for bin in munged slurmctld slurmd sbatch squeue sinfo; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "not installed: ${missing[*]} (apt-get install -y slurm-wlm munge)" >&2
  exit 3
fi

dir=$(realpath -m "$dir")
node=hfpeer1
conf=$dir/slurm.conf

stop() {
  for name in slurmd slurmctld munged; do
    pidfile=$dir/run/$name.pid
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [[ $cmd == stop ]]; then
  stop
  exit 0
fi
[[ $cmd == start ]] || { echo "unknown command: $cmd" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run as root: slurmd starts jobs as their user" >&2; exit 2; }

port=${SLURM_PEER_PORT:-16817}
mkdir -p "$dir"/{run,log,munge,spool/ctld,spool/d}
chmod 700 "$dir/munge"

# munge: a fresh key and a socket of our own, so a system munged (if any) is left alone.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed"

cat >"$conf" <<CONF
ClusterName=hfpeer
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=error
SlurmdDebug=error
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MaxJobCount=100000
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=64 State=UNKNOWN
PartitionName=bench Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

export SLURM_CONF=$conf
trap 'stop' ERR
slurmctld -c -f "$conf"
slurmd -N "$node" -f "$conf"

# Ready when the node is idle (slurmd registered, the controller accepts jobs).
for _ in $(seq 300); do
  state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
  if [[ $state == idle ]]; then
    echo "SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.1
done
echo "the Slurm node did not become idle (state: '${state:-none}'); see $dir/log" >&2
stop
exit 1
