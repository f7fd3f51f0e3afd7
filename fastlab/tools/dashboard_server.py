"""What `make dashboard` serves a room with: Voila's kernel manager, culling idle kernels (Voila 0.5 cannot shut a
closed tab's down, voila issue 1458) but never a kernel a page has just been given from Voila's pool."""

from __future__ import annotations

from datetime import datetime, timezone

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager


class RoomKernelManager(AsyncMappingKernelManager):
    """A kernel's idle time counts from when it left Voila's pool, at the latest: a full idle timeout."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._out_of_pool: dict[str, datetime] = {}

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        # Voila's pooling subclass calls this only for kernels out of its pool: the first call follows the hand-out
        # (or a kernel's start, when the pool was empty) by at most one cull interval.
        first = self._out_of_pool.setdefault(kernel_id, datetime.now(timezone.utc))
        kernel = self._kernels.get(kernel_id)
        if kernel is not None and getattr(kernel, "last_activity", first) < first:
            kernel.last_activity = first
        await super().cull_kernel_if_idle(kernel_id)

    async def shutdown_kernel(self, kernel_id: str, *args, **kwargs) -> None:
        self._out_of_pool.pop(kernel_id, None)
        await super().shutdown_kernel(kernel_id, *args, **kwargs)
