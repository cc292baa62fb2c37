"""The workers' environment: the variables the launcher sets (public names, see DESIGN.md)
and the ones elasticrun passes to its own worker code."""

from __future__ import annotations

# Worker environment (public names, see DESIGN.md).
ENV_HOSTNAME = "ELASTICRUN_HOSTNAME"
ENV_RANK = "ELASTICRUN_RANK"
ENV_SIZE = "ELASTICRUN_SIZE"
ENV_LOCAL_RANK = "ELASTICRUN_LOCAL_RANK"
ENV_LOCAL_SIZE = "ELASTICRUN_LOCAL_SIZE"
ENV_CROSS_RANK = "ELASTICRUN_CROSS_RANK"
ENV_CROSS_SIZE = "ELASTICRUN_CROSS_SIZE"
ENV_RENDEZVOUS_ADDR = "ELASTICRUN_RENDEZVOUS_ADDR"
ENV_RENDEZVOUS_PORT = "ELASTICRUN_RENDEZVOUS_PORT"
# Horovod's launcher sets these (values at spawn, never updated); scripts written for
# horovodrun read them, e.g. HOROVOD_RANK as "the rank this process started with".
HOROVOD_ENV_PREFIX = "HOROVOD_"
HOROVOD_ELASTIC = "HOROVOD_ELASTIC"
# Internal: who this process is, the job secret, and worker-side timeouts.
ENV_WORKER_ID = "ELASTICRUN_WORKER_ID"
ENV_SECRET = "ELASTICRUN_SECRET"
ENV_COLLECTIVE_TIMEOUT = "ELASTICRUN_COLLECTIVE_TIMEOUT"
ENV_ROUND_TIMEOUT = "ELASTICRUN_ROUND_TIMEOUT"
ENV_DRIVER_TIMEOUT = "ELASTICRUN_DRIVER_TIMEOUT"
# "0": this worker does not report stalled collectives (--no-hang-detection).
ENV_HANG_DETECTION = "ELASTICRUN_HANG_DETECTION"
ENV_STRAGGLERS = "ELASTICRUN_STRAGGLERS"  # --stragglers: off stops the pace reports
# --backend auto|gloo|nccl (for CUDA tensors), and the CUDA device a worker is pinned to.
ENV_BACKEND = "ELASTICRUN_BACKEND"
# "1" when the job's membership may change (--min-np, --max-np, discovery), else "0".
ENV_ELASTIC = "ELASTICRUN_ELASTIC"
ENV_CUDA_DEVICE = "ELASTICRUN_CUDA_DEVICE"
# The round a worker was started for: a script that never calls er.init() stays in it, and
# its foothold (worker/foothold.py) reports for it.
ENV_ROUND = "ELASTICRUN_ROUND"
# Modules a worker template imports besides torch (comma-separated); "0" also turns off
# the imports it takes from the script itself (worker/preload.py).
ENV_PRELOAD = "ELASTICRUN_PRELOAD"
# --timeline-filename: record from init() on ("1"), with a CYCLE mark per optimizer step.
ENV_TIMELINE = "ELASTICRUN_TIMELINE"
ENV_TIMELINE_MARK_CYCLES = "ELASTICRUN_TIMELINE_MARK_CYCLES"
DEFAULT_DRIVER_TIMEOUT_S = 300.0  # --driver-grace
# The operator's secrets: read by the driver, never passed on to workers.
ENV_WEBHOOK_TOKEN = "ELASTICRUN_WEBHOOK_TOKEN"
ENV_EVENT_SECRET = "ELASTICRUN_EVENT_SECRET"
ENV_AGENT_TOKEN = "ELASTICRUN_AGENT_TOKEN"  # authenticates `elasticrun agent`s to the driver
# Where commits are kept (torch/elastic/keeper.py): the host snapshot directory ("": none),
# --checkpoint-dir ("": none) and --checkpoint-interval; "1" in ENV_RESTORE: the worker was
# started to replace workers that were all lost, so its round must restore a kept commit.
ENV_SNAPSHOT_DIR = "ELASTICRUN_SNAPSHOT_DIR"
ENV_CHECKPOINT_DIR = "ELASTICRUN_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL = "ELASTICRUN_CHECKPOINT_INTERVAL"
ENV_RESTORE = "ELASTICRUN_RESTORE"
# --shard-size: workers per replica group (elastic HSDP); the same for every worker of a job.
ENV_SHARD_SIZE = "ELASTICRUN_SHARD_SIZE"
# "0": local workers are exec'd, never forked from a worker template (launch/local/forked.py).
ENV_WORKER_TEMPLATE = "ELASTICRUN_WORKER_TEMPLATE"
