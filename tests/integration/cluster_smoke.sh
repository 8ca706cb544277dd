#!/usr/bin/env bash
# Smoke test of the development cluster (run as root after `scripts/cluster.sh up`):
# alice and bob each submit a one-GPU job at the same time; both must complete,
# be accounted with gres/gpu, overlap in time, and hold different GPUs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
eval "$("$REPO/scripts/cluster.sh" env)"
export PATH=/usr/sbin:/sbin:$PATH

fail() { printf 'cluster_smoke: FAIL: %s\n' "$*" >&2; exit 1; }

# Poll CMD every 0.5 s for at most SECS seconds.
wait_until() {
  local secs=$1 deadline
  shift
  deadline=$((SECONDS + secs))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

# Submit as USER; the job prints the node and GPU indexes it was given, then
# sleeps so that the two jobs overlap. Prints the job id.
submit() {
  local user=$1 out
  out=$(runuser -u "$user" -- sbatch --parsable --gres=gpu:1 --job-name="smoke-$user" \
    --chdir="$WORK" --output="$WORK/%j.out" \
    --wrap 'echo "$SLURMD_NODENAME $SLURM_JOB_GPUS"; sleep 5') ||
    fail "sbatch as $user was refused"
  echo "${out%%;*}"
}

# One sacct field of the job allocation (not its steps).
job_field() { sacct -j "$1" -X -P -n --format="$2"; }

finished() {
  local id
  for id in "$@"; do
    case $(job_field "$id" State) in
    PENDING | RUNNING | REQUEUED | RESIZING | SUSPENDED | "") return 1 ;;
    esac
  done
}

check_job() {
  local id=$1 line
  line=$(sacct -j "$id" -P -n --format=State,AllocTRES | head -n 1)
  [[ $line == COMPLETED\|* ]] || fail "job $id ended as '${line%%|*}', not COMPLETED (see $WORK/$id.out)"
  [[ $line == *gres/gpu=1* ]] || fail "job $id has no gres/gpu=1 in AllocTRES: '$line'"
  [[ $(cat "$WORK/$id.out") =~ ^gpu[0-9]+\ [0-9]+$ ]] ||
    fail "job $id did not print its node and SLURM_JOB_GPUS: '$(cat "$WORK/$id.out")'"
}

main() {
  [ "$(id -u)" -eq 0 ] || fail "run as root (it submits as alice and bob)"
  [[ $(timeout 5 scontrol ping 2>/dev/null) == *"is UP"* ]] ||
    fail "slurmctld does not answer: run scripts/cluster.sh up first"
  WORK=$(mktemp -d "$GPUEFF_CLUSTER_DIR/smoke.XXXXXX")
  chmod 1777 "$WORK"

  local a b
  a=$(submit alice)
  b=$(submit bob)
  wait_until 60 finished "$a" "$b" || fail "jobs $a and $b did not finish within 60 s"
  check_job "$a"
  check_job "$b"

  # ISO timestamps compare as strings.
  local start_a end_a start_b end_b
  IFS='|' read -r start_a end_a < <(job_field "$a" Start,End)
  IFS='|' read -r start_b end_b < <(job_field "$b" Start,End)
  [[ $start_a < $end_b && $start_b < $end_a ]] ||
    fail "jobs did not run concurrently ($a: $start_a..$end_a, $b: $start_b..$end_b)"
  [ "$(cat "$WORK/$a.out")" != "$(cat "$WORK/$b.out")" ] ||
    fail "concurrent jobs $a and $b got the same GPU: $(cat "$WORK/$a.out")"

  echo "cluster_smoke: OK: job $a (alice) on $(cat "$WORK/$a.out"), job $b (bob) on $(cat "$WORK/$b.out")"
  rm -rf "$WORK"
}

main "$@"
