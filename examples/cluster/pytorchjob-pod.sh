#!/bin/sh
# pskv in a pod of a Kubeflow PyTorchJob (pytorchjob.yaml): sh pytorchjob-pod.sh COMMAND...
#
# The operator gives every pod RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the manifest
# gives POD_IP (the downward API) and DMLC_NUM_SERVER. Pod 0 runs the scheduler on its own
# address, port MASTER_PORT+1 (MASTER_PORT stays torch.distributed's; in the master pod
# MASTER_ADDR may be localhost); pod r < DMLC_NUM_SERVER runs server r; every pod runs
# COMMAND, one worker, which takes its rank, the number of workers and the scheduler's
# address from RANK, WORLD_SIZE and MASTER_ADDR / MASTER_PORT (pskv.config.rank_env).
# The pod ends with the worker's exit code once its scheduler and server have ended
# (they end when every worker has left the job); a failed worker stops them at once.
set -eu
: "${POD_IP:?set POD_IP to the pod's address (fieldRef status.podIP)}"
: "${PYTHON:=python}"
export DMLC_NUM_SERVER="${DMLC_NUM_SERVER:-1}" DMLC_NODE_HOST="$POD_IP"
if [ "$DMLC_NUM_SERVER" -gt "$WORLD_SIZE" ]; then
  echo "pytorchjob-pod.sh: DMLC_NUM_SERVER=$DMLC_NUM_SERVER: at most one server per pod, and there are $WORLD_SIZE pods" >&2
  exit 2
fi
trap 'kill $(jobs -p) 2>/dev/null; exit 143' TERM INT
if [ "$RANK" = 0 ]; then
  DMLC_ROLE=scheduler DMLC_PS_ROOT_URI="$POD_IP" DMLC_PS_ROOT_PORT=$((MASTER_PORT + 1)) "$PYTHON" -m pskv scheduler &
  export DMLC_PS_ROOT_URI="$POD_IP"  # this pod's processes reach the scheduler here (not localhost)
fi
if [ "$RANK" -lt "$DMLC_NUM_SERVER" ]; then
  DMLC_ROLE=server PSKV_SERVER_RANK="$RANK" "$PYTHON" -m pskv server &
fi
code=0
DMLC_ROLE=worker "$@" || code=$?
if [ "$code" != 0 ]; then
  kill $(jobs -p) 2>/dev/null || true
fi
wait || true
exit "$code"
