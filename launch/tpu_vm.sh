#!/bin/bash
# Cloud TPU VM slice (every worker runs the same command) or a single multi-GPU host (untested here: no TPU or
# GPU on this machine).
#
#   launch/tpu_vm.sh TPU_NAME ZONE --config=configs/il.py:owv --workdir=gs://bucket/runs/il ...
#       runs jaxagent.main on all workers of the TPU VM slice TPU_NAME. jax.distributed.initialize() finds
#       the coordinator, process count and id from the TPU metadata server; no env vars are needed.
#       The repo and its environment must already be on every worker (e.g. `--worker=all --command="git
#       clone ... && pip install -e ."`); the workdir must be shared (a gs:// bucket or NFS).
#   launch/tpu_vm.sh local --config=... --workdir=...
#       one host with several GPUs (or a single-host TPU VM): one process sees all local devices, so no
#       jax.distributed is needed; the mesh spans the local devices.
set -euo pipefail
if [[ "${1:-}" == "local" ]]; then
  shift
  exec python -m jaxagent.main "$@"
fi
tpu_name="$1" zone="$2"
shift 2
printf -v args '%q ' "$@"
remote_dir="${JAXAGENT_DIR:-jaxagent}"  # the checkout on each worker, relative to its home directory
gcloud compute tpus tpu-vm ssh "$tpu_name" --zone="$zone" --worker=all \
  --command="cd $remote_dir && PYTHONUNBUFFERED=1 python -m jaxagent.main $args--config.distributed=True"
