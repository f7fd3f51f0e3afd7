import asyncio
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

pytest.importorskip("jupyter_server")

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager  # noqa: E402

from fastlab.tools.dashboard_server import RoomKernelManager  # noqa: E402


def test_a_kernel_fresh_out_of_the_pool_gets_a_full_idle_timeout(monkeypatch):
    shut = []

    async def shutdown(self, kernel_id, *args, **kwargs):
        shut.append(kernel_id)

    monkeypatch.setattr(AsyncMappingKernelManager, "shutdown_kernel", shutdown)
    manager = RoomKernelManager()
    manager.cull_idle_timeout = 60
    preheated = datetime.now(timezone.utc) - timedelta(minutes=10)  # waited ten minutes in Voila's pool
    kernel = SimpleNamespace(last_activity=preheated, execution_state="idle", kernel_name="python3",
                             kernel_spec=SimpleNamespace(metadata={}))
    manager._kernels["k"] = kernel
    asyncio.run(manager.cull_kernel_if_idle("k"))  # the first check after the hand-out: the page may not be connected
    assert shut == [] and kernel.last_activity > preheated
    manager._out_of_pool["k"] -= timedelta(seconds=61)  # still no connection a timeout later: a closed tab
    kernel.last_activity = preheated
    asyncio.run(manager.cull_kernel_if_idle("k"))
    assert shut == ["k"] and "k" not in manager._out_of_pool
