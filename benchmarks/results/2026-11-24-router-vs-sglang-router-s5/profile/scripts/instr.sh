#!/bin/bash
# Instructions per request of the in-process dispatcher (valgrind callgrind Ir, (N=1000 - N=200)/800), for each CODE_ROOT given
for v in "$@"; do
  declare -A ir
  for n in 200 1000; do
    ir[$n]=$(CODE_ROOT=$v METRICS=${METRICS:-1} valgrind --tool=callgrind --callgrind-out-file=/dev/null /work/main/.venv/bin/python /tmp/p5/direct.py $n ${C:-128} 1 2>&1 | grep Collected | awk '{print $4}')
  done
  echo "$v METRICS=${METRICS:-1} c=${C:-128}: $(( (ir[1000] - ir[200]) / 800 )) instructions/request"
done
