#!/usr/bin/env bash
# One node agent of a slime-cpp job, run by slime_train.sbatch as an srun task on each node.
# Waits for the head's <run dir>/head.json on the shared file system, then replaces itself with
#   slime_train agent --head HOST:PORT --token-file <run dir>/head.json --node-name NAME
# NAME is SLURM's node name; with SLIME_AGENT_NAME_SUFFIX=1 (several agents per node, or agents
# on the head's node) each task is a node of its own, <node>-a<local task id>.
#
# Environment: SLIME_TRAIN_BIN, SLIME_RUN_DIR (required), SLIME_AGENT_NAME_SUFFIX (default 0),
# SLIME_AGENT_ARGS (extra agent arguments), SLIME_HEAD_WAIT_S (default 120).
set -euo pipefail

log() { echo "[slime.agent ${SLURMD_NODENAME:-$(hostname -s)}:${SLURM_LOCALID:-0} $(date '+%H:%M:%S')] $*"; }
: "${SLIME_TRAIN_BIN:?set SLIME_TRAIN_BIN to the slime_train binary}"
: "${SLIME_RUN_DIR:?set SLIME_RUN_DIR to the shared run dir of the job}"
head_json="$SLIME_RUN_DIR/head.json"

wait_s="${SLIME_HEAD_WAIT_S:-120}"
deadline=$((SECONDS + wait_s))
until [ -s "$head_json" ]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "error: no $head_json after ${wait_s} s (is the run dir on a shared file system?)"
    exit 2
  fi
  sleep 0.5
done
# head.json is one JSON object written atomically: {"address": "HOST:PORT", "token": ..., ...}
address=$(sed -n 's/.*"address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$head_json" | head -n 1)
[ -n "$address" ] || { log "error: $head_json has no \"address\""; exit 2; }

node="${SLURMD_NODENAME:-$(hostname -s)}"
if [ "${SLIME_AGENT_NAME_SUFFIX:-0}" = 1 ]; then
  node="$node-a${SLURM_LOCALID:-0}"
fi
read -r -a extra <<< "${SLIME_AGENT_ARGS:-}"
log "joining head $address as node $node"
exec "$SLIME_TRAIN_BIN" agent --head "$address" --token-file "$head_json" --node-name "$node" \
  "${extra[@]}"
