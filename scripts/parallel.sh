#!/usr/bin/env bash
# Run each argument as a shell command, all at once; print each one's output, in argument order, once all
# have ended, with its wall and CPU seconds; exit 1 if any failed. `make test` and `make test-fast` run their
# suites side by side with it.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for i in $(seq 1 $#); do
  (
    start=$(date +%s)
    # a fresh bash runs the lane, then reports its children's CPU time (user, sys) with `times`
    bash -c 'bash -c "$1"; rc=$?; times >"$2"; exit $rc' lane "${!i}" "$dir/$i.cpu"
    rc=$?
    echo "$(($(date +%s) - start)) s wall, CPU (user sys) $(tail -1 "$dir/$i.cpu")" >"$dir/$i.time"
    exit $rc
  ) >"$dir/$i" 2>&1 &
  pids+=($!)
done
rc=0
status=()
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then status+=(ok); else status+=(FAILED); rc=1; fi
done
for i in "${!pids[@]}"; do
  n=$((i + 1))
  echo "=== ${!n}"
  cat "$dir/$n"
done
echo "=== summary"
for i in "${!pids[@]}"; do
  n=$((i + 1))
  echo "${status[$i]}: $(cat "$dir/$n.time"): ${!n}"
done
exit $rc
