# A one-node Slurm cluster on this machine, for the test and the overhead measurement (sourced):
# Debian's slurm-wlm and munge (installed with apt-get where missing), munged, slurmctld and slurmd
# in the foreground with a generated slurm.conf, everything in a temporary folder of ours.
#   local_slurm_install      returns 1 with $local_slurm_why set where it cannot (not root, no apt-get)
#   local_slurm_start        sets SLURM_CONF and $local_slurm_dir; fails with the daemons' logs
#   local_slurm_stop         cancels our jobs, stops the daemons we started (by pid), removes the folder
#   local_slurm_wait JOBS S  waits until none of the comma-separated jobs is queued, at most S seconds

local_slurm_pids=()
local_slurm_dir=

local_slurm_install() {
  if [[ $(id -u) != 0 ]]; then local_slurm_why="not root (munged, slurmctld and slurmd run as root here)"; return 1; fi
  local tool
  for tool in slurmctld slurmd munged mungekey sbatch; do
    command -v "$tool" >/dev/null && continue
    if ! command -v apt-get >/dev/null; then local_slurm_why="no apt-get to install slurm-wlm and munge"; return 1; fi
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge)
    if ! "${apt[@]}" >/tmp/kvq-slurm-apt.log 2>&1 &&
       ! { apt-get update -q >/dev/null 2>&1 && "${apt[@]}" >/tmp/kvq-slurm-apt.log 2>&1; }; then
      local_slurm_why="apt-get install slurm-wlm munge failed (/tmp/kvq-slurm-apt.log)"
      return 1
    fi
    break
  done
}

local_slurm_logs() { tail -n 20 "$local_slurm_dir"/log/* >&2 2>/dev/null || true; }

local_slurm_start() {
  local d
  d=$(mktemp -d /tmp/kvq-slurm.XXXXXX)
  local_slurm_dir=$d
  chmod 711 "$d"
  mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log" && chmod 711 "$d/munge"
  mungekey -c -k "$d/munge/munge.key" >/dev/null 2>&1
  chmod 600 "$d/munge/munge.key"
  munged -F -f --socket="$d/munge/munge.sock" --key-file="$d/munge/munge.key" --pid-file="$d/munge/munged.pid" \
    --seed-file="$d/munge/munged.seed" --log-file="$d/log/munged.log" >"$d/log/munged.out" 2>&1 &
  local_slurm_pids+=($!)
  for _ in $(seq 50); do [[ -S $d/munge/munge.sock ]] && break; sleep 0.1; done
  [[ -S $d/munge/munge.sock ]] || { local_slurm_logs; echo "munged did not start" >&2; return 1; }
  local host port
  host=$(hostname -s)
  port=$((20000 + $$ % 20000 * 2))  # ports of our own: another Slurm on this machine keeps its
  cat >"$d/slurm.conf" <<EOF
ClusterName=kvqlocal
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=2
NodeName=$host CPUs=$(nproc) RealMemory=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo) State=UNKNOWN
PartitionName=kvq Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -D -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
  local_slurm_pids+=($!)
  slurmd -D -f "$SLURM_CONF" >"$d/log/slurmd.out" 2>&1 &
  local_slurm_pids+=($!)
  for _ in $(seq 60); do [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && return 0; sleep 0.5; done
  local_slurm_logs
  echo "the node did not come up idle" >&2
  return 1
}

local_slurm_stop() {
  set +e
  if [[ -n ${SLURM_CONF:-} ]] && ((${#local_slurm_pids[@]} > 1)); then
    scancel --full --quiet $(squeue -h -o %A 2>/dev/null | sort -u) 2>/dev/null
    for _ in $(seq 20); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
  fi
  local i
  for ((i = ${#local_slurm_pids[@]} - 1; i >= 0; i--)); do kill "${local_slurm_pids[i]}" 2>/dev/null; done
  for i in "${local_slurm_pids[@]}"; do wait "$i" 2>/dev/null; done
  local_slurm_pids=()
  [[ -n $local_slurm_dir ]] && rm -rf "$local_slurm_dir"
}

local_slurm_wait() {
  local t0=$SECONDS
  while [[ -n $(squeue -h -j "$1" 2>/dev/null) ]]; do
    ((SECONDS - t0 < $2)) || { squeue >&2; local_slurm_logs; echo "jobs $1 still queued after $2 s" >&2; return 1; }
    sleep 0.2
  done
}
