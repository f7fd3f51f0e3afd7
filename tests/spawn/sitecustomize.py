"""Python as a macOS or Windows laptop runs it: `spawn` is the default multiprocessing start method.

Python imports `sitecustomize` at startup from its import path, so with this folder on PYTHONPATH every process
started with that environment begins here: pytest, the notebook's kernel, the forkserver behind fastlab's runs, and
the DataLoader workers themselves. fastlab carries its caller's start method into each run's child process
(`isolation._begin`), so the workers of fastlab's own runs are spawned too, as on a Mac. Linux's default, `fork`,
hides the pitfall spawn shows: a spawned worker re-imports the Dataset's class by name, and one defined in a
notebook cell (`__main__`) cannot be imported.

With FASTLAB_WORKER_LOG naming a file, every process started appends `<start method> <target>` to it (the method
is the one that really started it), so a test can see that DataLoader workers were spawned, not just asked to be.
"""

import multiprocessing
import os
from multiprocessing.process import BaseProcess

multiprocessing.set_start_method("spawn", force=True)

_start = BaseProcess.start


def _start_and_log(self: BaseProcess) -> None:
    """BaseProcess.start, then one line for FASTLAB_WORKER_LOG: how the process was started, and what it runs."""
    target = getattr(self, "_target", None)  # start() drops it
    _start(self)
    log = os.environ.get("FASTLAB_WORKER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{self._popen.method} {getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}\n")


BaseProcess.start = _start_and_log
