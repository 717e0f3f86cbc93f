"""What a launcher tells the processes it starts about itself: that it holds the run directory's owner lock.

    env[LAUNCHER_ENV] = launcher_owner()     # a launcher holding the lock (sr1/launch/pools.py's learner_children)
    os.environ.get(LAUNCHER_ENV) == ...      # the learner: "<host>:<pid>" of the lock's owner, to take none itself

The learner's entry point takes the owner lock itself unless the launcher named here holds it
(sr1/entrypoints/learner.py), so a learner started by hand beside a live run stops at once. It is sr1's own variable,
not a config key (config/environment.py's NOT_CONFIG).
"""

from __future__ import annotations

import os
import socket

LAUNCHER_ENV = "SR1_RUN_OWNER"


def launcher_owner() -> str:
    """This process as the run lock's owner record names it: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"
