#!/usr/bin/env bash
# Run each argument as a shell command, all at once; print each one's output, in argument order, once all
# have ended; exit 1 if any failed. Used by `make test-fast` to run the three venvs' suites side by side.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for i in $(seq 1 $#); do
  bash -c "${!i}" >"$dir/$i" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  n=$((i + 1))
  if ! wait "${pids[$i]}"; then rc=1; fi
  echo "=== ${!n}"
  cat "$dir/$n"
done
exit $rc
