#!/usr/bin/env bash
# A real Slurm development cluster on this one machine, with simulated GPUs, on one of
# three Slurm releases and either cgroup version.
#
#   cluster.sh up       start (or complete) the cluster; idempotent
#   cluster.sh down     stop every daemon of the cluster and remove its directory
#   cluster.sh env      print `export` lines: eval "$(scripts/cluster.sh env)"
#   cluster.sh as USER CMD [ARGS...]
#                       run CMD as USER (root or a test user) against the running cluster,
#                       inside its release's root where it has one, with the cluster's
#                       environment and the project's commands (sbatch, sacct, gpueff,
#                       gpueff-sim, the release's seff, ...) on PATH
#   cluster.sh status   which daemons run, the store's engine, and sinfo
#   cluster.sh restart slurmctld|slurmdbd   stop a daemon and start it again (the soak's fault)
#   cluster.sh store sqlite|postgresql
#                       switch a running cluster's store engine: the hooks and gpueff
#                       read gpueff.toml at every run, so the next epilog delivers there
#
# Everything (configs, Slurm state, logs, pid files, MariaDB, the munge socket,
# device nodes, the gpueff store and spool) lives under one directory, so that
# `down` leaves nothing behind and the system's own services are never touched.
# Environment: GPUEFF_CLUSTER_DIR (default /var/tmp/gpueff-cluster),
# GPUEFF_NODES (default 3: multi-node jobs need more than one), GPUEFF_PORT_BASE (default 16800),
# GPUEFF_STORE (`up`'s store engine: sqlite, the default, a file under the cluster dir; or
# postgresql, a private server under $DIR/pg from scripts/pg.sh),
# GPUEFF_SLURM (`up`'s release: 22.05, the host's own Debian 12 packages, the default;
# 24.11 or 26.05, in a Debian root from scripts/slurm-root.sh), GPUEFF_CGROUP (v1, the
# default on 22.05, or v2, the default on the newer two). The other commands act on the
# release and cgroup version the cluster was started with (kept in its marker file).
# The controller runs as sites run it: SlurmUser=slurm.
# Why each setting is what it is: /work/shared/notes/slurm-test-cluster.md and, for the
# newer releases and cgroup v2, slurm-newer.md beside it.
set -euo pipefail

ORIG_PATH=$PATH
# The daemons live in sbin, which a non-login root shell may not have on PATH.
export PATH=/usr/sbin:/sbin:$PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
STANDIN=$REPO/build/nvml/current/libnvidia-ml.so.1  # the GPUs' "driver" (make builds it)
DIR=$(realpath -m "${GPUEFF_CLUSTER_DIR:-/var/tmp/gpueff-cluster}")
NODES=${GPUEFF_NODES:-3}
PORT_BASE=${GPUEFF_PORT_BASE:-16800}
CLUSTER=gpueffdev
SLURM_USER=slurm                    # Debian's packages make this user (uid 64030)

ETC=$DIR/etc
RUN=$DIR/run
LOG=$DIR/log
DB_DIR=$DIR/mysql/data
MARKER=$DIR/.gpueff-cluster        # `down` removes only a directory `up` made; it holds
                                   # the cluster's release and cgroup version
MUNGE_SOCKET=$RUN/munge/munge.socket
MYSQL_SOCKET=$DIR/mysql/mysqld.sock  # mariadbd runs as mysql: its files in its dir
MYSQL_PORT=$((PORT_BASE + 6))
CTLD_PORT=$((PORT_BASE + 17))
DBD_PORT=$((PORT_BASE + 19))
PG_PORT=$((PORT_BASE + 8))
PG_DIR=$DIR/pg                      # the store's PostgreSQL server (scripts/pg.sh)
PG_SH=$REPO/scripts/pg.sh
STORE=${GPUEFF_STORE:-sqlite}
DB_PASS=gpueffdev                   # loopback-only, throwaway database
HOST=$(uname -n)
HOST=${HOST%%.*}                    # what `hostname -s` prints, without needing it
export SLURM_CONF=$ETC/slurm.conf   # slurmdbd finds slurmdbd.conf beside it

# The release and cgroup version: `up` takes them from GPUEFF_SLURM and GPUEFF_CGROUP,
# every other command from the marker of the cluster that runs (else the defaults).
flavour() {
  local key value
  # `up` with no release asked for keeps the cluster's; with another, check_flavour replaces it
  { [ "${1:-}" = up ] && [ -n "${GPUEFF_SLURM:-}" ]; } || [ ! -r "$MARKER" ] || while IFS== read -r key value; do
    case $key in slurm) SLURM_REL=$value ;; cgroup) CGROUP=$value ;; esac # repo: check_flavour
  done <"$MARKER"
  SLURM_REL=${SLURM_REL:-${GPUEFF_SLURM:-22.05}}
  [ "$SLURM_REL" = 22.05 ] && CGROUP=${CGROUP:-${GPUEFF_CGROUP:-v1}} || CGROUP=${CGROUP:-${GPUEFF_CGROUP:-v2}}
  case $SLURM_REL in
  22.05) ROOT="" VENV=$REPO/.venv SEFF=$REPO/.peers/seff ;;
  24.11 | 26.05)
    ROOT=$(bash "$REPO/scripts/slurm-root.sh" path "$SLURM_REL")
    # The hooks and jobs run the root's own Python (3.13 or 3.14), so a venv of its own.
    VENV=$REPO/build/venv-$SLURM_REL SEFF=$REPO/.peers/seff-$SLURM_REL
    ;;
  *) die "GPUEFF_SLURM must be 22.05, 24.11 or 26.05, not '$SLURM_REL'" ;;
  esac
  [[ $CGROUP =~ ^v[12]$ ]] || die "GPUEFF_CGROUP must be v1 or v2, not '$CGROUP'"
  [ "$SLURM_REL/$CGROUP" != 22.05/v2 ] || die "cgroup v2 runs on 24.11 and 26.05 here (in their roots), not on the host's 22.05"
  VENV_BIN=$VENV/bin
}
SLURM_REL="" CGROUP="" ROOT="" VENV="" VENV_BIN="" SEFF=""
# slurmd's view of cgroup v2 on a v1 host (slurm_gpu_eff/sim/cgroup2/unified_only.c)
PRELOAD=$REPO/build/cgroup2/libunified_only.so
ROOT_PRELOAD=/usr/local/lib/gpueff/libunified_only.so # where the root has it
# Each slurmd's cgroup v2 namespace: a directory of the host's unified hierarchy
CG2_PARENT=/sys/fs/cgroup/unified/gpueff-$(printf '%s' "$DIR" | md5sum | cut -c1-8)

# A Slurm command or daemon of the cluster's release: inside its root where it has one
# (Slurm's RPCs take clients of the two previous releases only: the host's 22.05 commands
# cannot talk to a 24.11 controller). chroot starts in /; nothing here needs another cwd.
slurm() {
  if [ -n "$ROOT" ]; then
    chroot "$ROOT" /usr/bin/env SLURM_CONF="$SLURM_CONF" "$@"
  else
    "$@"
  fi
}

# user:account pairs that get a Slurm association (root's comes with the cluster).
# carol coordinates physics (alice's account); dave is in the admin group, which reads
# the store (docs/security.md), as SlurmUser does: the idle watch runs as SlurmUser and
# reads the store's running rows. Jobs are private (PrivateData=jobs), as on many sites.
ASSOCIATIONS=(alice:physics bob:chem carol:physics dave:chem)
COORDINATORS=(carol:physics)
ADMIN_GROUP=gpueffadm
# Mail to a job's user goes to USER@MAIL_DOMAIN (slurm.conf MailDomain), by SMTP to a test's server
MAIL_DOMAIN=gpueffdev.invalid
ADMINS=(dave)
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

say() { printf 'cluster: %s\n' "$*"; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

# Die after the end of LOG, which is where a daemon says why it failed.
die_with_log() {
  local log=$1
  shift
  if [ -s "$log" ]; then
    printf -- '--- last lines of %s ---\n' "$log" >&2
    tail -n 25 "$log" >&2
  fi
  die "$*"
}

# Poll CMD every 0.2 s for at most SECS seconds: a daemon that never comes up
# fails fast instead of the script sleeping blindly.
wait_until() {
  local secs=$1 deadline
  shift
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

node_names() { seq -f 'gpu%g' 1 "$NODES"; }
# mig1: one H100 in MIG mode, two GPU instances, each a gres of its own named by its
# capability file (as Slurm's AutoDetect does), in a partition of its own so that no
# other test's job lands there.
MIG_NODE=mig1
MIG_CAP_MAJOR=238 # nvidia-caps' major is dynamic on a real node; any free one will do here
all_nodes() { node_names; echo "$MIG_NODE"; }

# Pids of processes named NAME that belong to this cluster: their command line
# or environment names the cluster directory (slurmdbd takes no config option,
# only SLURM_CONF from its environment). Stale pid files, or a daemon whose pid
# file was never written, cannot fool this. With ARG, the command line must
# also hold ARG as one argument (slurmd's node name).
cluster_pids() {
  local name=$1 arg=${2:-} pid
  for pid in $(pgrep -x "$name" || true); do
    grep -qszF -- "$DIR/" "/proc/$pid/cmdline" "/proc/$pid/environ" || continue
    [ -z "$arg" ] || grep -qszxF -- "$arg" "/proc/$pid/cmdline" || continue
    echo "$pid"
  done
}

require_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (it starts daemons and creates users)"; }

# ---------------------------------------------------------------- preparation

check_settings() {
  [[ $NODES =~ ^[1-9][0-9]?$ ]] || die "GPUEFF_NODES must be 1..99, not '$NODES'"
  [[ $STORE =~ ^(sqlite|postgresql)$ ]] || die "the store engine must be sqlite or postgresql, not '$STORE'"
  [[ $PORT_BASE =~ ^[1-9][0-9]{3,4}$ ]] && ((PORT_BASE + 20 + NODES < 65536)) ||
    die "GPUEFF_PORT_BASE must leave room for ports up to +$((20 + NODES)), not '$PORT_BASE'"
  [ -x "$VENV_BIN/python" ] ||
    die "$VENV_BIN/python is missing: build the venv first (the Makefile does)"
  [ -r "$STANDIN" ] ||
    die "$STANDIN is missing: build the stand-in NVML library first (make cluster does)"
}

# Refuse to adopt (and later delete) a directory that `up` did not make, and one that
# another user could have made or can write to: root's prolog and epilog run from it.
# Empty directories of root's alone hold nothing to lose: a late log line of a helper
# that outlived `down` leaves such a one (the owner checks below still apply).
prepare_dir() {
  if [ -d "$DIR" ] && [ ! -e "$MARKER" ] &&
    [ -n "$(find "$DIR" -mindepth 1 \( ! -type d -o ! -uid 0 \) -print -quit)" ]; then
    die "$DIR exists, holds files and was not made by cluster.sh; pick another GPUEFF_CLUSTER_DIR"
  fi
  local path
  for path in "$DIR" "$ETC" "$MARKER"; do
    [ -e "$path" ] || continue
    [ "$(stat -c %u "$path")" = 0 ] && [ -z "$(find "$path" -maxdepth 0 -perm /022)" ] ||
      die "$path is not root's alone (owner $(stat -c %U "$path"), mode $(stat -c %a "$path")): root's prolog would run from it; remove it or pick another GPUEFF_CLUSTER_DIR"
  done
  install -d -m 0755 "$DIR" "$ETC" "$RUN" "$LOG" "$DIR/slurm" \
    "$DIR/slurm/ctld" "$DIR/nodes" "$DIR/sim" "$DIR/store" "$DIR/spool"
  install -d -m 1777 "$DIR/sim/state" # jobs of unprivileged users write here
  # What SlurmUser's processes write: slurmctld's state and pid, slurmdbd's pid, their
  # logs, and the MailProg's spool and log (it runs as SlurmUser, as the idle watch does).
  install -d -o "$SLURM_USER" -g "$SLURM_USER" -m 0755 "$DIR/slurm/ctld" "$RUN/slurm"
  install -d -o "$SLURM_USER" -g "$SLURM_USER" -m 0700 "$DIR/mail"
  local log
  for log in slurmctld slurmdbd mail; do
    [ -e "$LOG/$log.log" ] || install -m 0640 /dev/null "$LOG/$log.log"
    chown "$SLURM_USER:" "$LOG/$log.log"
  done
  # One dir per node, writable by all and NOT sticky: a job of bob's must be able to
  # replace (rename over) the state file that a job of alice's left on the same GPU.
  local node
  for node in $(all_nodes); do install -d -m 0777 "$DIR/sim/state/$node"; done
  printf 'slurm=%s\ncgroup=%s\nrepo=%s\n' "$SLURM_REL" "$CGROUP" "$REPO" >"$MARKER"
}

ensure_users() {
  local pair user
  for pair in "${ASSOCIATIONS[@]}"; do
    user=${pair%%:*}
    id "$user" >/dev/null 2>&1 || useradd -m "$user"
  done
  getent group "$ADMIN_GROUP" >/dev/null || groupadd "$ADMIN_GROUP"
  for user in "${ADMINS[@]}" "$SLURM_USER"; do
    id -nG "$user" | grep -qw "$ADMIN_GROUP" || usermod -a -G "$ADMIN_GROUP" "$user"
  done
}

# First directory on the way to PATH that USER cannot traverse.
first_closed_dir() {
  local user=$1 path=$2 dir="" part
  local -a parts
  IFS=/ read -ra parts <<<"${path#/}"
  for part in "${parts[@]}"; do
    dir+=/$part
    runuser -u "$user" -- test -x "$dir" || break
  done
  echo "$dir"
}

# Jobs of alice and bob run gpueff-sim and gpueff from the venv and read the
# cluster's configs; a checkout under /root, say, would fail only inside jobs.
check_user_access() {
  local target
  local -a targets=("$VENV_BIN/python" "$ETC")
  [ "$STORE" != postgresql ] || targets+=("$PG_DIR/socket") # gpueff's read path
  for target in "${targets[@]}"; do
    runuser -u alice -- test -x "$target" ||
      die "user alice cannot reach $target: make $(first_closed_dir alice "$target") traversable by others (chmod o+x)"
  done
}

# ---------------------------------------------------------------- configuration

SLURM_RUNNING=""

# Write stdin to PATH with MODE unless PATH already holds exactly that, so a
# second `up` changes nothing. A Slurm config that would change under running
# daemons (another GPUEFF_NODES, say) is refused: they would not agree with it.
put_file() {
  local path=$1 mode=$2 read_at_start=${3:-} tmp
  tmp=$(mktemp "$path.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
  elif [ -n "$read_at_start" ] && [ -n "$SLURM_RUNNING" ]; then
    rm -f "$tmp"
    die "the running cluster was started with another $(basename "$path") (GPUEFF_NODES?); run '$0 down' first"
  else
    mv -f "$tmp" "$path"
  fi
  chmod "$mode" "$path"
}

write_slurm_conf() {
  local node k=0
  {
    cat <<EOF
# Generated by scripts/cluster.sh: edits are lost at the next \`up\`.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
# As sites run it: slurmctld, slurmdbd, the MailProg and our idle watch as this user.
SlurmUser=$SLURM_USER
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/slurm/ctld
SlurmdSpoolDir=$DIR/slurm/d/%n
SlurmctldPidFile=$RUN/slurm/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, memory as a consumable gives each job the whole node and
# jobs never share a node.
DefMemPerCPU=1000
GresTypes=gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT
# The munge socket for talking to slurmdbd: AuthInfo does not cover it.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
# As on a real site: a user without an association cannot submit.
AccountingStorageEnforce=associations
JobCompType=jobcomp/none
# gpueff-mail with this cluster's config (write_hook_wrappers); mail to alice goes to
# alice@$MAIL_DOMAIN, by SMTP to 127.0.0.1:8025 (a test's server; none: it waits in the spool)
MailProg=$ETC/mailprog
MailDomain=$MAIL_DOMAIN
PrologFlags=Alloc
Prolog=$ETC/prolog
Epilog=$ETC/epilog
PrologEpilogTimeout=30
KillWait=5
MinJobAge=10
# As many sites: users see their own jobs only (and coordinators their accounts').
PrivateData=jobs
InactiveLimit=0
# A node that was down (e.g. its slurmd was killed) returns when it registers.
ReturnToService=2
# Nodes claim 4 CPUs on 2-core machines; trust the config, not the hardware.
SlurmdParameters=config_overrides
EOF
    for node in $(all_nodes); do
      k=$((k + 1))
      gres=gpu:4
      [ "$node" = "$MIG_NODE" ] && gres=gpu:2
      echo "NodeName=$node NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT_BASE + 20 + k)) CPUs=4 RealMemory=4000 Gres=$gres State=UNKNOWN"
    done
    echo "PartitionName=gpu Nodes=$(node_names | paste -sd,) Default=YES MaxTime=INFINITE State=UP"
    echo "PartitionName=mig Nodes=$MIG_NODE MaxTime=INFINITE State=UP"
  } | put_file "$ETC/slurm.conf" 0644 read_at_start
}

# cgroup v2 here has no memory, cpu or cpuset controller (the host holds them in v1),
# and no systemd: IgnoreSystemd. 26.05 names job cgroups by SLUID unless
# CgroupJobIdPaths=yes, which is left unset, as sites leave it.
write_slurm_side_confs() {
  {
    echo "CgroupPlugin=cgroup/$CGROUP"
    [ "$CGROUP" = v1 ] || echo "IgnoreSystemd=yes"
    printf '%s\n' ConstrainDevices=yes ConstrainCores=no ConstrainRAMSpace=no
  } | put_file "$ETC/cgroup.conf" 0644 read_at_start
  {
    node_names | while read -r node; do
      echo "NodeName=$node Name=gpu File=$DIR/nodes/$node/nvidia[0-3]"
    done
    echo "NodeName=$MIG_NODE Name=gpu File=$DIR/nodes/$MIG_NODE/nvidia-caps/nvidia-cap12"
    echo "NodeName=$MIG_NODE Name=gpu File=$DIR/nodes/$MIG_NODE/nvidia-caps/nvidia-cap21"
  } | put_file "$ETC/gres.conf" 0644 read_at_start
  # slurmdbd refuses a config readable by others: it holds the DB password.
  put_file "$ETC/slurmdbd.conf" 0600 read_at_start <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdPort=$DBD_PORT
SlurmUser=$SLURM_USER
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
PrivateData=jobs
EOF
  chown "$SLURM_USER:" "$ETC/slurmdbd.conf" # slurmdbd insists on owning it
}

# Prolog/epilog wrappers: they point the repo's hooks at this cluster's config.
# Until the other half of the project exists they do nothing, successfully:
# a failing prolog would drain the node.
write_hook_wrappers() {
  local hook
  for hook in prolog epilog; do
    put_file "$ETC/$hook" 0755 <<EOF
#!/bin/sh
# Generated by scripts/cluster.sh
export GPUEFF_CONFIG=$ETC/gpueff.toml
export SLURM_CONF=$SLURM_CONF
export GPUEFF_PYTHON=$VENV_BIN/python
[ -x $REPO/$hook/gpueff-$hook ] || exit 0
exec $REPO/$hook/gpueff-$hook "\$@"
EOF
  done
  put_file "$ETC/mailprog" 0755 <<EOF
#!/bin/sh
# Generated by scripts/cluster.sh: Slurm's MailProg (run by slurmctld with an environment
# of Slurm's own: no PATH, no config path)
export GPUEFF_CONFIG=$ETC/gpueff.toml
export SLURM_CONF=$SLURM_CONF
exec $VENV_BIN/gpueff-mail "\$@"
EOF
}

# The [store] keys for $STORE: the SQLite file, or the private PostgreSQL server's URLs
# (writers: role gpueff over TCP, its password in root's $PG_DIR/pgpass; admins' reads:
# role gpueff_read on the Unix socket, peer authentication for root and the admin group). Users
# read their figures through sacct (the AdminComment), never the store.
store_settings() {
  local url read_url
  if [ "$STORE" = postgresql ]; then
    url=$(bash "$PG_SH" url "$PG_DIR") && read_url=$(bash "$PG_SH" read-url "$PG_DIR") || return 1
    echo "url = \"$url\""
    echo "read_url = \"$read_url\""
  else
    echo "path = \"$DIR/store/gpueff.db\""
  fi
}

write_gpueff_toml() {
  local store
  store=$(store_settings) || die "no URL for the store under $PG_DIR"
  put_file "$ETC/gpueff.toml" 0644 <<EOF
[gpu]
library = "$STANDIN"
mig_minors = "$DIR/nodes/%n/mig-minors"
map_file = "$DIR/nodes/%n/gpu-map.json"
[sim]
devices = "$DIR/sim/devices.json"
state_dir = "$DIR/sim/state"
[sampler]
interval_s = 1
checkpoint_s = 2
live_s = 5
[spool]
dir = "$DIR/spool/%n"
retry_s = 2
retry_max_s = 5
[store]
$store
admin_group = "$ADMIN_GROUP"
[log]
file = "$LOG/gpueff-%n.log"
[slurm]
live_mirror_s = 5
[report]
price_per_kwh = 0.25
currency = "EUR"
co2_g_per_kwh = 350
median_file = "$DIR/public/cluster-median.json"
[mail]
smtp_host = "127.0.0.1"
smtp_port = 8025
from = "slurm@$MAIL_DOMAIN"
spool_dir = "$DIR/mail"
log_file = "$LOG/mail.log"
domain = "$MAIL_DOMAIN"
idle_check_s = 2
wait_s = 60
retry_s = 2
retry_max_s = 5
footer = "The development cluster: see README.md."
EOF
}

# Deterministic UUID in NVML's form, distinct per node and minor.
gpu_uuid() {
  local h
  h=$(printf 'gpueffdev-%s-%s' "$1" "$2" | md5sum)
  echo "GPU-${h:0:8}-${h:8:4}-${h:12:4}-${h:16:4}-${h:20:12}"
}

# gpu1 and gpu2 have H100s (GPM: SM activity and pipes); gpu3, if there, older A100s
# without GPM, so both kinds of report are exercised.
write_devices_json() {
  local node minor sep_node="" sep_gpu model
  # Their links as the SXM boards have them: PCIe Gen5 x16 and 18 NVLinks of NVLink 4.0
  # (nvmlNvlinkVersion_t 6) on the H100, Gen4 x16 and 12 of NVLink 3 (an A100 answers 5).
  local h100='"name": "NVIDIA H100 80GB HBM3 (simulated)", "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 70, "gpm": true, "pcie_gen": 5, "pcie_width": 16, "nvlinks": 18, "nvlink_version": 6'
  local a100='"name": "NVIDIA A100-SXM4-40GB (simulated)", "memory_total_gib": 40, "power_limit_w": 400, "idle_power_w": 55, "gpm": false, "pcie_gen": 4, "pcie_width": 16, "nvlinks": 12, "nvlink_version": 5'
  {
    printf '{'
    for node in $(node_names); do
      printf '%s\n  "%s": [' "$sep_node" "$node"
      sep_node=, sep_gpu=""
      model=$h100
      [ "$node" = gpu3 ] && model=$a100
      for minor in 0 1 2 3; do
        printf '%s\n    {"minor": %d, "uuid": "%s", %s}' \
          "$sep_gpu" "$minor" "$(gpu_uuid "$node" "$minor")" "$model"
        sep_gpu=,
      done
      printf '\n  ]'
    done
    printf ',\n  "%s": [\n    {"minor": 0, "uuid": "%s", %s, "mig": [' \
      "$MIG_NODE" "$(gpu_uuid "$MIG_NODE" 0)" "$h100"
    printf '{"gi_id": 1, "uuid": "%s", "memory_total_gib": 10}, ' "$(gpu_uuid "$MIG_NODE" gi1 | sed s/^GPU-/MIG-/)"
    printf '{"gi_id": 2, "uuid": "%s", "memory_total_gib": 10}]}\n  ]' "$(gpu_uuid "$MIG_NODE" gi2 | sed s/^GPU-/MIG-/)"
    printf '\n}\n'
  } | put_file "$DIR/sim/devices.json" 0644
}

# slurmd accepts only real character devices in gres.conf; major 195 is NVIDIA's.
# gpu2's device files are numbered against Slurm's order (nvidia0 is minor 3, ...), as
# AutoDetect can order GPUs by PCI bus rather than by minor: the sampler must bind
# Slurm's index to the file's minor (slurmd -G), never assume they are equal.
make_device_nodes() {
  local node index minor dev cap
  for node in $(node_names); do
    install -d -m 0755 "$DIR/nodes/$node" "$DIR/slurm/d/$node"
    for index in 0 1 2 3; do
      minor=$index
      [ "$node" = gpu2 ] && minor=$((3 - index))
      dev=$DIR/nodes/$node/nvidia$index
      [ -c "$dev" ] && [ "$(stat -c %T "$dev")" = "$(printf '%x' "$minor")" ] && continue
      rm -f "$dev"
      mknod -m 0666 "$dev" c 195 "$minor"
    done
  done
  # mig1: the capability files of its two GPU instances, and the driver's table that
  # says which GPU and instance each opens (/proc/driver/nvidia-caps/mig-minors there).
  install -d -m 0755 "$DIR/nodes/$MIG_NODE/nvidia-caps" "$DIR/slurm/d/$MIG_NODE"
  for cap in 12 21; do
    dev=$DIR/nodes/$MIG_NODE/nvidia-caps/nvidia-cap$cap
    [ -c "$dev" ] || mknod -m 0666 "$dev" c "$MIG_CAP_MAJOR" "$cap"
  done
  printf '%s\n' 'config 1' 'monitor 2' 'gpu0/gi1/access 12' 'gpu0/gi1/ci0/access 13' \
    'gpu0/gi2/access 21' 'gpu0/gi2/ci0/access 22' >"$DIR/nodes/$MIG_NODE/mig-minors"
}

write_configs() {
  if [ -n "$(cluster_pids slurmctld)$(cluster_pids slurmd)$(cluster_pids slurmdbd)" ]; then
    SLURM_RUNNING=yes
  fi
  write_slurm_conf
  write_slurm_side_confs
  write_hook_wrappers
  write_gpueff_toml
  write_devices_json
  make_device_nodes
}

# ---------------------------------------------------------------- a release's root

# What a root shares with the host, at the same paths: the kernel's files, /tmp, /var/tmp
# and the checkout (a file made on the host can be handed to a job; a test's private
# PostgreSQL server keeps its password file in /var/tmp), the cluster's directory, and
# the host's CA bundle (pip). --make-rslave: unmounting these later must not reach back
# into the host's own mounts. The users are copied, not bound (copy_users).
ROOT_BINDS=(/dev /sys /tmp /var/tmp /etc/hosts /etc/ssl/certs)
root_binds() {
  printf '%s\n' "${ROOT_BINDS[@]}" "$REPO"
  case $DIR/ in /tmp/* | /var/tmp/*) ;; *) echo "$DIR" ;; esac
}

mount_root() {
  local path
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc" || die "cannot mount /proc in $ROOT"
  while read -r path; do
    mountpoint -q "$ROOT$path" && continue
    if [ -d "$path" ]; then mkdir -p "$ROOT$path"; else touch "$ROOT$path"; fi
    mount --rbind "$path" "$ROOT$path" && mount --make-rslave "$ROOT$path" ||
      die "cannot bind $path into $ROOT"
  done < <(root_binds)
}

# Deepest first; lazily, so a process that still has a file open there cannot stop it.
# Again while any is left: a mount stacked over another hides it until it goes.
unmount_root() {
  local target round
  [ -n "$ROOT" ] && [ -d "$ROOT" ] || return 0
  for round in 1 2 3 4 5; do
    mounted_in_root | grep -q . || return 0
    mounted_in_root | sort -r | while read -r target; do umount -l "$target" 2>/dev/null || true; done
  done
  say "still mounted under $ROOT: $(mounted_in_root | paste -sd' ')"
}
mounted_in_root() { awk -v root="$ROOT/" 'index($5, root) == 1 { print $5 }' /proc/self/mountinfo; }

# The release's own venv, made by the root's Python (jobs and hooks run it there), with
# pyslurm for the release where its sources are at hand (24.11; compiled once, then kept).
ensure_root_venv() {
  [ -n "$ROOT" ] || return 0
  local source  # the venv's scripts are copies of these, made at install time
  for source in pyproject.toml bin/gpueff prolog/gpueff-prolog epilog/gpueff-epilog; do
    [ "$VENV/.installed" -nt "$REPO/$source" ] || { make_root_venv; break; }
  done
  bash "$REPO/scripts/build-pyslurm.sh" root "$SLURM_REL" "$VENV" || die "could not build pyslurm for Slurm $SLURM_REL"
}

make_root_venv() {
  say "making $VENV with the root's $(chroot "$ROOT" python3 --version)"
  rm -rf "$VENV"
  chroot "$ROOT" python3 -m venv "$VENV" &&
    chroot "$ROOT" /usr/bin/env PIP_CERT=/etc/ssl/certs/ca-certificates.crt HOME=/tmp \
      "$VENV_BIN/pip" install -q --disable-pip-version-check -e "$REPO[postgres]" >"$LOG/venv.log" 2>&1 &&
    chroot "$ROOT" "$VENV_BIN/python" -c 'from slurm_gpu_eff.report.render import precompile; precompile()' ||
    die_with_log "$LOG/venv.log" "could not make $VENV"
  touch "$VENV/.installed"
}

# The package's bytecode for the Python that jobs, hooks and users run, as an installed copy
# has it (pip compiles at install): an editable install leaves it to the first run, and
# the users who run gpueff cannot write it, so each of their runs compiled every module
# it loads again (on 24.11, whose Python no root-run test had compiled for, `gpueff
# JOBID` took 110 ms where Slurm's seff takes 27 ms).
compile_package() {
  if [ -n "$ROOT" ]; then
    chroot "$ROOT" "$VENV_BIN/python" -m compileall -q "$REPO/slurm_gpu_eff" >/dev/null
  else
    "$VENV_BIN/python" -m compileall -q "$REPO/slurm_gpu_eff" >/dev/null
  fi || say "could not compile the package's bytecode: its users' runs compile it each time"
}

ensure_root() {
  [ -n "$ROOT" ] || return 0
  bash "$REPO/scripts/slurm-root.sh" build "$SLURM_REL" >/dev/null || die "no root for Slurm $SLURM_REL"
  mount_root
  ensure_root_venv
}

# The same alice, bob and slurm inside the root as out. A copy: useradd replaces
# /etc/passwd by a rename, which a bind mount of the file would not follow.
copy_users() {
  [ -n "$ROOT" ] || return 0
  cp -p /etc/passwd /etc/group /etc/shadow "$ROOT/etc/"
}

# Commands for PATH: Slurm's seff of this release as `seff` (run as it is, never copied in)
write_bin() {
  install -d -m 0755 "$DIR/bin"
  put_file "$DIR/bin/seff" 0755 <<EOF
#!/bin/sh
# Generated by scripts/cluster.sh: Slurm $SLURM_REL's own seff, the peer of gpueff
exec perl $SEFF "\$@"
EOF
}

# ---------------------------------------------------------------- daemons

# The private PostgreSQL server (idempotent: a running one is left alone).
ensure_pg() {
  local out
  out=$(GPUEFF_PG_READ_GROUP=$ADMIN_GROUP bash "$PG_SH" start "$PG_DIR" "$PG_PORT" 2>&1) || { echo "$out" >&2; die "PostgreSQL did not start under $PG_DIR"; }
  say "postgres: ${out#pg: }"
}

# ensure LABEL LOG TIMEOUT CHECK START PROCESS [ARG]: run START unless this
# cluster's PROCESS (with ARG) already runs, then wait until CHECK [ARG] passes.
ensure() {
  local label=$1 log=$2 timeout=$3 check=$4 start=$5 proc=$6 arg=${7:-} pids how
  pids=$(cluster_pids "$proc" "$arg" | paste -sd,)
  if [ -n "$pids" ]; then
    how="already running (pid $pids)"
  else
    "$start" $arg >>"$log" 2>&1 || die_with_log "$log" "$label failed to start"
    how=started
  fi
  wait_ready "$label" "$log" "$timeout" "$check" "$proc" "$arg"
  say "$label: $how"
}

# Poll CHECK until it passes; give up at once when the daemon has exited
# (after 2 s of grace for it to fork), else after TIMEOUT seconds.
wait_ready() {
  local label=$1 log=$2 timeout=$3 check=$4 proc=$5 arg=$6
  local deadline=$((SECONDS + timeout)) grace=$((SECONDS + 2))
  until "$check" $arg >/dev/null; do
    if ((SECONDS >= grace)) && [ -z "$(cluster_pids "$proc" "$arg")" ]; then
      die_with_log "$log" "$label exited while starting"
    fi
    ((SECONDS < deadline)) || die_with_log "$log" "$label did not come up within ${timeout}s"
    sleep 0.2
  done
}

# munged runs as the munge user with its own key, socket and seed under $DIR,
# so it neither needs nor disturbs the system's munged.
start_munged() {
  install -d -o munge -g munge -m 0755 "$RUN/munge" || return 1
  if [ ! -s "$ETC/munge.key" ]; then
    dd if=/dev/urandom of="$ETC/munge.key" bs=1024 count=1 status=none || return 1
  fi
  chown munge:munge "$ETC/munge.key" "$LOG/munged.log" && chmod 0400 "$ETC/munge.key" || return 1
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$ETC/munge.key" \
    --log-file="$LOG/munged.log" --pid-file="$RUN/munge/munged.pid" \
    --seed-file="$RUN/munge/munged.seed"
}
munge_ok() { munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }

mysqld_bin() { command -v mariadbd || command -v mysqld; }

# A datadir whose initialisation did not finish (a crash) is made again.
init_datadir() {
  install -d -o mysql -g mysql -m 0755 "$DIR/mysql" &&
    chown mysql:mysql "$LOG/mysqld.log" || return 1
  [ -e "$DIR/mysql/initialized" ] && return 0
  # Slurm daemons running on a database that vanished would hold stale ids.
  [ -z "$SLURM_RUNNING" ] || die "the accounting database under $DB_DIR is gone while Slurm runs; run '$0 down' first"
  rm -rf "$DB_DIR"
  install -d -o mysql -g mysql -m 0750 "$DB_DIR" || return 1
  mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR" \
    --auth-root-authentication-method=socket --skip-test-db || return 1
  touch "$DIR/mysql/initialized"
}

# --no-defaults: nothing from /etc/mysql, so the system's MariaDB settings
# (socket, pid file, port) cannot collide with ours.
start_mysqld() {
  init_datadir || return 1
  rm -f "$DIR/mysql/mysqld.pid"
  setsid -f "$(mysqld_bin)" --no-defaults --user=mysql --datadir="$DB_DIR" \
    --socket="$MYSQL_SOCKET" --pid-file="$DIR/mysql/mysqld.pid" --port="$MYSQL_PORT" \
    --bind-address=127.0.0.1 --skip-name-resolve --innodb-lock-wait-timeout=900 --log-error="$LOG/mysqld.log" \
    </dev/null
}
mysql_root() { mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root "$@"; }
mysql_ok() { mysql_root -e 'SELECT 1' >/dev/null 2>&1; }

# Idempotent statements, so they run at every `up`.
setup_database() {
  mysql_root >>"$LOG/mysqld.log" 2>&1 <<EOF || die_with_log "$LOG/mysqld.log" "could not create the Slurm database"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
}

start_slurmdbd() { rm -f "$RUN/slurm/slurmdbd.pid" && slurm slurmdbd; }
slurmdbd_ok() { slurm timeout 10 sacctmgr -n show cluster >/dev/null 2>&1; }

# sacctmgr ARGS, or die with what it said (it reports errors on stdout).
sacctmgr_or_die() {
  local out
  out=$(slurm timeout 10 sacctmgr "$@" 2>&1) || die_with_log "$LOG/slurmdbd.log" "sacctmgr $* failed: $out"
  echo "$out"
}

# Cluster, accounts and associations; only what is missing is added.
setup_accounts() {
  local have pair user account
  have=$(sacctmgr_or_die -n -P show cluster format=cluster)
  grep -qx "$CLUSTER" <<<"$have" || sacctmgr_or_die -i add cluster "$CLUSTER" >/dev/null
  have=$(sacctmgr_or_die -n -P show assoc cluster="$CLUSTER" format=user,account)
  for pair in "${ASSOCIATIONS[@]}"; do
    user=${pair%%:*} account=${pair#*:}
    grep -qx "|$account" <<<"$have" || {
      sacctmgr_or_die -i add account "$account" cluster="$CLUSTER" >/dev/null
      have+=$'\n'"|$account"  # two users of one account: added once
    }
    grep -qx "$user|$account" <<<"$have" ||
      sacctmgr_or_die -i add user "$user" account="$account" cluster="$CLUSTER" >/dev/null
  done
  # `add cluster` gives root the account `root`; a leftover database may not.
  grep -q '^root|' <<<"$have" ||
    sacctmgr_or_die -i add user root account=root cluster="$CLUSTER" >/dev/null
  for pair in "${COORDINATORS[@]}"; do
    user=${pair%%:*} account=${pair#*:}
    sacctmgr_or_die -n -P show account "$account" withcoord format=coordinators | grep -qw "$user" ||
      sacctmgr_or_die -i add coordinator account="$account" names="$user" >/dev/null
  done
}

start_slurmctld() { rm -f "$RUN/slurm/slurmctld.pid" && slurm slurmctld -f "$SLURM_CONF"; }
slurmctld_ok() { [[ $(slurm timeout 5 scontrol ping 2>/dev/null) == *"is UP"* ]]; }

start_slurmd() {
  rm -f "$RUN/slurmd-$1.pid"
  if [ "$CGROUP" = v1 ]; then
    slurm slurmd -f "$SLURM_CONF" -N "$1"
  else
    start_slurmd_v2 "$1"
  fi
}

# cgroup v2 on a host that mounts v1 (slurm-newer.md, "cgroup v2 here"): slurmd in a
# cgroup of its own in the host's unified hierarchy, then in a private mount and cgroup
# namespace rooted there, with a cgroup2 mount at its root's /sys/fs/cgroup (set_preload
# makes every process of the root see only the "0::" line of /proc/PID/cgroup). The one
# process goes from bash to unshare to chroot to slurmd by exec, so nothing else is in that cgroup while slurmd
# empties it (a short-lived process there made slurmd fail: "cannot empty the false root").
start_slurmd_v2() {
  mkdir -p "$CG2_PARENT/$1" || return 1
  setsid -f bash "$REPO/scripts/cluster.sh" _slurmd_v2 enter "$CG2_PARENT/$1" "$1" </dev/null \
    >>"$LOG/slurmd-$1.log" 2>&1
}

# The steps of start_slurmd_v2, each ending in exec: `enter CGROUP NODE` moves this
# process into CGROUP and makes the namespaces; `inside NODE` mounts cgroup2 and starts slurmd.
slurmd_v2_step() {
  case $1 in
  enter)
    echo $$ >"$2/cgroup.procs"
    exec unshare -m -C --propagation private bash "$REPO/scripts/cluster.sh" _slurmd_v2 inside "$3"
    ;;
  inside)
    mount -t cgroup2 none "$ROOT/sys/fs/cgroup"
    exec chroot "$ROOT" /usr/bin/env SLURM_CONF="$SLURM_CONF" slurmd -D -f "$SLURM_CONF" -N "$2"
    ;;
  esac
}

# The view of cgroup v2 that Slurm's cgroup/v2 plugin insists on, for every process of the
# root while a v2 cluster runs (slurm_gpu_eff/sim/cgroup2/unified_only.c says why). Built on
# the host, whose glibc is older than the roots': it loads there.
set_preload() {
  local src=$REPO/slurm_gpu_eff/sim/cgroup2/unified_only.c
  [ -n "$ROOT" ] || return 0
  if [ "$CGROUP" = v1 ]; then
    rm -f "$ROOT/etc/ld.so.preload"
    return 0
  fi
  if [ ! "$PRELOAD" -nt "$src" ]; then
    mkdir -p "$(dirname "$PRELOAD")"
    gcc -shared -fPIC -O2 -Wall -o "$PRELOAD.tmp" "$src" -ldl && mv -f "$PRELOAD.tmp" "$PRELOAD" ||
      die "could not build $PRELOAD"
  fi
  install -D -m 0644 "$PRELOAD" "$ROOT$ROOT_PRELOAD"
  echo "$ROOT_PRELOAD" >"$ROOT/etc/ld.so.preload"
}

# Each node's GPU map (Slurm's GPU indexes -> device files), made once as root, as a site's
# slurmd start-up would: no job's sampler then asks slurmd (on 24.11 `slurmd -G` sends every
# running step a reconfigure request).
make_gpu_maps() {
  local node
  for node in $(all_nodes); do
    on_node "$node" /usr/bin/env SLURM_CONF="$SLURM_CONF" GPUEFF_CONFIG="$ETC/gpueff.toml" "$VENV_BIN/python" -I -m slurm_gpu_eff.node.binding \
      --refresh "$node" >>"$LOG/gpu-map.log" 2>&1 || die_with_log "$LOG/gpu-map.log" "no GPU map for $node"
  done
}

# CMD where NODE's slurmd runs: on cgroup v2, inside its namespaces (slurmd -G sets up
# Slurm's cgroup plugin, which needs the cgroup2 mount only they have).
on_node() {
  local node=$1 pid
  shift
  [ "$CGROUP" = v2 ] || { slurm "$@"; return; }
  pid=$(cluster_pids slurmd "$node" | head -n 1)
  [ -n "$pid" ] || { echo "no slurmd for $node" >&2; return 1; }
  nsenter -t "$pid" -m -C -r "$@"
}

# gpueff-mail's service (as a site runs it beside slurmctld, as SlurmUser): the idle-GPU
# check (off in this configuration; tests turn it on) and the mail spool's retries.
start_mailwatch() {
  setsid -f $([ -z "$ROOT" ] || echo chroot "$ROOT") runuser -u "$SLURM_USER" -- \
    env -i GPUEFF_CONFIG="$ETC/gpueff.toml" SLURM_CONF="$SLURM_CONF" PATH=/usr/bin:/bin \
    "$VENV_BIN/python" -I -m slurm_gpu_eff.mail.prog "$1" </dev/null
}
mailwatch_ok() { [ -n "$(cluster_pids python "$1")" ]; }
stop_mailwatch() {
  local pids
  pids=$(cluster_pids python --watch)
  [ -z "$pids" ] || { kill $pids 2>/dev/null || true; wait_until 10 not_mailwatch || true; }
}
not_mailwatch() { ! mailwatch_ok --watch; }

declare -A RESUMED=()
# A node is ready when it can take jobs. One left drained or down by an earlier
# run (a failed prolog, a killed slurmd) is resumed once, and said so.
node_ok() {
  local node=$1 state
  state=$(slurm timeout 5 sinfo -h -N -n "$node" -o %T 2>/dev/null) || return 1
  case $state in
  idle | mixed | allocated | completing) return 0 ;;
  drain* | down)
    if [ -z "${RESUMED[$node]:-}" ]; then
      RESUMED[$node]=1
      say "$node was $state ($(slurm sinfo -h -N -n "$node" -o %E)); resuming it" >&2
      slurm scontrol update nodename="$node" state=resume >&2 || true
    fi
    ;;
  esac
  return 1
}

# A cluster's directory holds one release's state (slurmctld's, the accounting
# database's): another release or cgroup version gets a new cluster, the old one taken down.
check_flavour() {
  local made
  [ -r "$MARKER" ] || return 0
  made=$(paste -sd' ' "$MARKER")
  # Another checkout's cluster too: on cgroup v2 its slurmds' private mount namespaces
  # were made before this checkout was bound into the root, and never see it.
  [ -z "$made" ] || [ "$made" = "slurm=$SLURM_REL cgroup=$CGROUP repo=$REPO" ] && return 0
  say "the cluster under $DIR runs $made: taking it down for slurm=$SLURM_REL cgroup=$CGROUP repo=$REPO"
  local want_slurm=$SLURM_REL want_cgroup=$CGROUP
  flavour # the old cluster's release, root and venv, for its `down`
  cmd_down
  SLURM_REL=$want_slurm CGROUP=$want_cgroup
  flavour up
}

cmd_up() {
  local start=$SECONDS node
  require_root
  check_flavour
  prepare_dir
  ensure_root
  compile_package
  check_settings
  set_preload
  ensure_users
  copy_users
  [ "$STORE" != postgresql ] || ensure_pg
  write_configs
  write_bin
  check_user_access
  ensure munged "$LOG/munged.log" 10 munge_ok start_munged munged
  ensure mysqld "$LOG/mysqld.log" 60 mysql_ok start_mysqld "$(basename "$(mysqld_bin)")"
  setup_database
  ensure slurmdbd "$LOG/slurmdbd.log" 30 slurmdbd_ok start_slurmdbd slurmdbd
  setup_accounts
  ensure slurmctld "$LOG/slurmctld.log" 30 slurmctld_ok start_slurmctld slurmctld
  for node in $(all_nodes); do
    ensure "slurmd $node" "$LOG/slurmd-$node.log" 30 node_ok start_slurmd slurmd "$node"
  done
  make_gpu_maps
  # started anew each time: a long-lived Python process keeps the code it started with
  stop_mailwatch
  ensure "gpueff-mail --watch" "$LOG/mail.log" 10 mailwatch_ok start_mailwatch python --watch
  say "up in $((SECONDS - start)) s: Slurm $SLURM_REL on cgroup $CGROUP, $NODES node(s) under $DIR, store $STORE"
  say "use it with: $0 as USER COMMAND...$([ -n "$ROOT" ] || echo " (or eval \"\$($0 env)\")")"
}

# A daemon stopped and started again, as an admin's restart does (the soak's fault).
cmd_restart() {
  require_root
  case $1 in
  slurmctld) stop_procs slurmctld && ensure slurmctld "$LOG/slurmctld.log" 30 slurmctld_ok start_slurmctld slurmctld ;;
  slurmdbd) stop_procs slurmdbd && ensure slurmdbd "$LOG/slurmdbd.log" 30 slurmdbd_ok start_slurmdbd slurmdbd ;;
  *) die "restart takes slurmctld or slurmdbd, not '$1'" ;;
  esac
}

# ---------------------------------------------------------------- down, env, status

# Let slurmstepd end running jobs properly, while slurmctld can still tell it to.
cancel_jobs() {
  local jobs
  [ -n "$(cluster_pids slurmctld)" ] || return 0
  jobs=$(slurm timeout 5 squeue -h -o %A 2>/dev/null) || return 0
  [ -n "$jobs" ] || return 0
  say "cancelling jobs: $(echo $jobs)"
  slurm scancel $jobs || true
  wait_until 15 no_jobs || say "jobs still listed after 15 s; stopping anyway"
}
no_jobs() { [ -z "$(slurm timeout 5 squeue -h -o %A 2>/dev/null)" ]; }
no_procs() { [ -z "$(cluster_pids "$1")" ]; }

# TERM, a bounded wait (MariaDB flushes), then KILL what is left.
stop_procs() {
  local name=$1 pids
  pids=$(cluster_pids "$name")
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null || true
  if ! wait_until 20 no_procs "$name"; then
    kill -KILL $(cluster_pids "$name") 2>/dev/null || true
    wait_until 5 no_procs "$name" || die "could not stop $name (pids $(cluster_pids "$name" | paste -sd,))"
  fi
  say "stopped $name (pid $(echo $pids | tr ' ' ,))"
}

# Our own detached processes (samplers, their delivery, mail workers and retriers)
# outlive slurmd: left running, one writes a log line after the rm below and leaves a
# directory that the next `up` refuses to adopt.
helper_pids() {
  local pid
  for pid in $(pgrep -f 'slurm_gpu_eff' || true); do
    [ "$pid" != $$ ] || continue
    grep -qszF -- "$DIR/" "/proc/$pid/cmdline" "/proc/$pid/environ" && echo "$pid"
  done
  return 0
}
no_helpers() { [ -z "$(helper_pids)" ]; }

stop_helpers() {
  local pids
  pids=$(helper_pids)
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null || true
  if ! wait_until 10 no_helpers; then
    kill -KILL $(helper_pids) 2>/dev/null || true
    wait_until 5 no_helpers || say "helpers still running: $(helper_pids | paste -sd,)"
  fi
  say "stopped our helpers (pid $(echo $pids | tr ' ' ,))"
}

# The cgroup v2 trees of start_slurmd_v2, deepest first (a cgroup goes with rmdir only).
remove_cgroups() {
  [ -d "$CG2_PARENT" ] || return 0
  find "$CG2_PARENT" -depth -type d -exec rmdir {} + 2>/dev/null || true
  [ ! -d "$CG2_PARENT" ] || say "left $CG2_PARENT (still in use?)"
}

cmd_down() {
  local name out
  require_root
  cancel_jobs
  for name in slurmd slurmstepd slurmctld slurmdbd mariadbd mysqld munged; do
    stop_procs "$name"
  done
  if [ -d "$PG_DIR" ]; then
    if out=$(bash "$PG_SH" stop "$PG_DIR" 2>&1); then
      say "postgres: ${out#pg: }"
    else
      say "pg.sh could not stop PostgreSQL ($out); killing it"
    fi
  fi
  stop_procs postgres # what pg.sh could not stop (its data dir is on the command line)
  stop_helpers
  unmount_root
  [ -z "$ROOT" ] || rm -f "$ROOT/etc/ld.so.preload"
  remove_cgroups
  if [ -e "$MARKER" ]; then
    rm -rf "$DIR"
    say "removed $DIR"
  elif [ -d "$DIR" ]; then
    say "left $DIR alone: cluster.sh did not make it"
  fi
}

# Only `export` lines, so that eval "$(cluster.sh env)" works, up or not.
# The venv goes first on PATH exactly once, however often this is evaluated.
cmd_env() {
  local path=":$ORIG_PATH:"
  path=${path//:$VENV_BIN:/:}
  path=${path#:}
  path=${path%:}
  printf 'export %s=%q\n' SLURM_CONF "$SLURM_CONF" GPUEFF_CONFIG "$ETC/gpueff.toml" \
    GPUEFF_CLUSTER_DIR "$DIR" GPUEFF_SLURM "$SLURM_REL" GPUEFF_CGROUP "$CGROUP" \
    GPUEFF_SLURM_ROOT "$ROOT" GPUEFF_VENV "$VENV" PATH "$VENV_BIN${path:+:$path}"
}

# USER runs COMMAND in the cluster's world: the release's root where it has one, cwd kept
# (the host's /tmp, the checkout and the cluster's directory are at the same paths there),
# the caller's environment plus the cluster's, and a PATH of the release's commands.
cmd_as() {
  local user=$1
  shift
  [ $# -gt 0 ] || { echo "usage: $0 as USER COMMAND [ARGS...]" >&2; exit 2; }
  [ -e "$MARKER" ] || die "no cluster under $DIR: run '$0 up' first"
  # A config the caller names (a test's own site) is kept; the cluster's otherwise.
  local -a env=(SLURM_CONF="$SLURM_CONF" GPUEFF_CONFIG="${GPUEFF_CONFIG:-$ETC/gpueff.toml}" GPUEFF_CLUSTER_DIR="$DIR"
    PATH="$VENV_BIN:$DIR/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
  local -a who=()
  [ "$user" = root ] || [ "$user" = "$(id -un)" ] || who=(runuser -u "$user" --)
  if [ -z "$ROOT" ]; then
    exec "${who[@]}" env "${env[@]}" "$@"
  fi
  [ "$(id -u)" -eq 0 ] || die "entering Slurm $SLURM_REL's root needs root (then: $0 as $user ...)"
  # shellcheck disable=SC2016 # for the inner shell
  exec chroot "$ROOT" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" \
    "${who[@]}" /usr/bin/env "${env[@]}" "$@"
}

cmd_status() {
  local name pids
  echo "cluster dir: $DIR$([ -e "$MARKER" ] || echo ' (absent)')"
  for name in "${DAEMONS[@]}"; do
    [ "$name" = mariadbd ] && name=$(basename "$(mysqld_bin)")
    pids=$(cluster_pids "$name" | paste -sd,)
    printf '%-10s %s\n' "$name" "$([ -n "$pids" ] && echo "running (pid $pids)" || echo "not running")"
  done
  if [ -d "$PG_DIR" ]; then
    printf '%-10s %s\n' postgres "$(bash "$PG_SH" status "$PG_DIR" || true) under $PG_DIR"
  fi
  printf '%-10s %s\n' store "$(sed -n '/^\[store\]/,/^\[/{/^[a-z_]* *=/p}' "$ETC/gpueff.toml" 2>/dev/null | paste -sd' ')"
  if slurmctld_ok; then
    slurm timeout 10 sinfo -N -l
  else
    echo "slurmctld does not answer: no sinfo"
  fi
}

# Switch the store engine of a cluster that `up` made: start PostgreSQL if need be and
# rewrite gpueff.toml (not read at Slurm's start: no restart needed). What waits in the
# spools goes to the new store; a PostgreSQL server no longer used keeps running (and
# its data) until `down`.
cmd_store() {
  STORE=${1:-}
  require_root
  check_settings
  [ -e "$MARKER" ] && [ -e "$ETC/gpueff.toml" ] || die "no cluster under $DIR: run '$0 up' first"
  prepare_dir
  [ "$STORE" != postgresql ] || ensure_pg
  write_gpueff_toml
  check_user_access
  say "store: $STORE ($(sed -n '/^\[store\]/,/^\[/{/^[a-z_]* *=/p}' "$ETC/gpueff.toml" | paste -sd' '))"
}

main() {
  flavour "${1:-}"
  case ${1:-} in
  as)
    shift
    [ $# -ge 2 ] || { echo "usage: $0 as USER COMMAND [ARGS...]" >&2; exit 2; }
    cmd_as "$@"
    ;;
  _slurmd_v2) shift && slurmd_v2_step "$@" ;;
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  store)
    [ $# -eq 2 ] || { echo "usage: $0 store sqlite|postgresql" >&2; exit 2; }
    cmd_store "$2"
    ;;
  restart)
    [ $# -eq 2 ] || { echo "usage: $0 restart slurmctld|slurmdbd" >&2; exit 2; }
    cmd_restart "$2"
    ;;
  *)
    echo "usage: $0 up|down|env|status|as USER CMD...|store sqlite|postgresql|restart slurmctld|slurmdbd" >&2
    exit 2
    ;;
  esac
}

main "$@"
