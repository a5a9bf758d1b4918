"""One way to start a NIXL agent, for the storage server's engine and the SDK's client alike.

NIXL's Python wrapper hard-codes the progress thread's delay to 0. Its UCX backend waits
for work with ``poll(worker eventfds, timeout=delay)``, so a delay of 0 makes the thread
spin: one idle agent burnt a whole core here (2.98 s of CPU in 3 s; with a 20 ms delay,
under 0.01 s). Every storage server with the rdma transport and every rdma client held
one, on 2-core nodes. The thread still wakes at once when a worker has events (its
eventfd is in the poll set); the delay only bounds how long it sleeps when nothing
signals. Progress stays on (the tests showed that without the thread a client that
never calls into NIXL does not answer connection checks).
"""

from __future__ import annotations

import threading
from typing import Any

PROGRESS_DELAY_US = 20_000

_patching = threading.Lock()


def new_agent(name: str) -> Any:
    """A ``nixl_agent`` named ``name`` with the UCX backend and a progress thread that sleeps when idle."""
    from nixl import _api

    base = _api.nixlBind.nixlAgentConfig

    class _Config(base):  # type: ignore[misc, valid-type]
        """The wrapper's config with a floor on the progress delay the wrapper sets to 0."""

        @property
        def pthrDelay(self) -> int:  # noqa: N802 - NIXL's name
            return base.pthrDelay.__get__(self)

        @pthrDelay.setter
        def pthrDelay(self, value: int) -> None:  # noqa: N802
            base.pthrDelay.__set__(self, max(value, PROGRESS_DELAY_US))

    with _patching:  # the wrapper reads the class from its module while it builds the agent
        _api.nixlBind.nixlAgentConfig = _Config
        try:
            agent = _api.nixl_agent(name, _api.nixl_agent_config(backends=[]))
        finally:
            _api.nixlBind.nixlAgentConfig = base
    agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    return agent
