"""The driver's HTTP surface: URL paths, the signing headers, and the limits on bodies and
long polls."""

from __future__ import annotations

# URL paths of the driver's server.
PATH_JOIN = "/v1/rendezvous/join"
PATH_NOTICES = "/v1/rendezvous/notices"
PATH_SYNCED = "/v1/rendezvous/synced"  # a worker holds the committed state of its round
PATH_TRAINED = "/v1/rendezvous/trained"  # a worker completed its first commit: it works
PATH_FAILING = "/v1/rendezvous/failing"  # a worker's own error ends it: it is about to exit
PATH_STALLED = "/v1/rendezvous/stalled"  # a collective waits far longer than usual
PATH_INIT = "/v1/rendezvous/init"  # a worker's script calls er.init(): no restart mode
PATH_TIMELINE = "/v1/timeline"  # a worker's trace events; opens the job's trace file
PATH_FLASH = "/v1/flash"  # a worker's flash commit cadence (elasticrun.flash)
PATH_PACE = "/v1/rendezvous/pace"  # a member's busy share outside collectives (stragglers)
PATH_KV_PREFIX = "/v1/kv/"
KV_OPS = ("set", "get", "add", "compare_set", "check", "delete", "num_keys", "wait", "multi_get")
# elasticrun.run(func): the cloudpickled (func, args, kwargs) out, each worker's result in,
# in parts of RESULT_PART_BYTES (base64 in JSON, a part stays under MAX_BODY_BYTES).
PATH_RUN_FUNCTION = "/v1/run/function"
PATH_RUN_RESULT = "/v1/run/result"
RESULT_PART_BYTES = 2 * 1024 * 1024

# Request signing.
HEADER_TIMESTAMP = "X-Elasticrun-Timestamp"
HEADER_NONCE = "X-Elasticrun-Nonce"
HEADER_SIGNATURE = "X-Elasticrun-Signature"
# The body's SHA-256 (hex): the signature covers it instead of the body, so the driver checks
# a request's signature from its headers alone, before reading (buffering) any of its body.
# Absent: the body is empty (a signed GET).
HEADER_BODY_DIGEST = "X-Elasticrun-Body-Digest"
# Every answer of the driver carries its epoch (the journal bumps it on each resume): a
# worker never obeys a driver older than one it has heard (a stale driver that woke up).
HEADER_EPOCH = "X-Elasticrun-Driver-Epoch"
SIGNATURE_WINDOW_S = 30.0
MAX_BODY_BYTES = 4 * 1024 * 1024
# Upper bound of one long-poll; clients re-ask after it, so no HTTP call waits unboundedly.
MAX_POLL_S = 30.0
