"""The contract between driver and workers: env-var names, URL paths, message shapes, signing.

Shared by both sides, so it imports neither torch nor aiohttp. Its parts are read as one
name space (`protocol.ENV_RANK`, `protocol.sign_headers`): the two sides must agree on all
of it at once, and one `from elasticrun import protocol` keeps each use naming the contract.
"""

from elasticrun.protocol.env import *  # noqa: F403
from elasticrun.protocol.http import *  # noqa: F403
from elasticrun.protocol.messages import *  # noqa: F403
from elasticrun.protocol.signing import *  # noqa: F403
