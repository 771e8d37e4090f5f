"""Where the simulations of `sim plan` and `sim sweep` run: in this process, in a pool of local
processes (the default, one per core), or on a Ray cluster.

Every backend has the same two calls: `submit(fn, arg)` returns a `concurrent.futures.Future`
and `close()`. The functions submitted are plain module-level functions of one picklable
argument that never raise (they return their error as data), so a driver can mix backends
with `concurrent.futures.wait`. Results always come back to the driver, which is the only
writer of files: a worker that outlives a killed driver can never write a half result."""

from __future__ import annotations

import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import usable_cpus

BACKENDS = ("local", "ray")


class InlineBackend:
    """Runs each task at once in this process (workers=1): no pool start-up, clean kills."""

    name = "local"
    workers = 1
    inline = True

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(arg))
        except BaseException as exc:  # KeyboardInterrupt propagates to the caller
            if not isinstance(exc, Exception):
                raise
            fut.set_exception(exc)
        return fut

    def close(self, cancel: bool = False) -> None:
        pass

    def describe(self) -> str:
        return "local, 1 worker (in process)"


def _ignore_sigint() -> None:
    """A worker's initializer. Ctrl-C in a terminal signals the whole process group: a worker
    interrupted inside the pool's queue code can die holding its lock and hang the driver's
    shutdown, so only the driver takes SIGINT and stops the workers itself (`close`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalBackend:
    """A ProcessPoolExecutor with `workers` processes."""

    name = "local"

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)

    def submit(self, fn, arg) -> Future:
        return self._pool.submit(fn, arg)

    def close(self, cancel: bool = False) -> None:
        """Wait for the pool; on `cancel` (an interrupt or an error) drop the queued tasks and end
        the running ones now rather than after their simulations finish."""
        # the pool's processes, taken before shutdown forgets them (Python 3.14 has terminate_workers())
        procs = list((getattr(self._pool, "_processes", None) or {}).values()) if cancel else []
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()

    def describe(self) -> str:
        return f"local, {self.workers} worker processes"


class RayBackend:
    """Ray tasks on a running cluster (`address`, e.g. 'auto' or 'ray://head:10001') or on a
    local instance started here with `workers` CPUs. The nodes need infersim installed (or a
    runtime_env shipping it); trace files named by the workload must exist on them."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise InfersimError("--backend ray needs Ray: pip install 'infersim[cluster]'") from None
        self._ray = ray
        self._started_here = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
            if address:
                kwargs["address"] = address
            elif workers:
                kwargs["num_cpus"] = workers
            try:
                ray.init(**kwargs)
            except Exception as exc:  # connection refused, bad address, cannot start
                raise InfersimError(
                    f"cannot start or reach Ray{f' at {address}' if address else ''}: "
                    f"{str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__}"
                ) from None
            self._started_here = True
        self.workers = int(ray.cluster_resources().get("CPU", workers or 1))
        self._remote = {}

    def submit(self, fn, arg) -> Future:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        return remote.remote(arg).future()

    def close(self, cancel: bool = False) -> None:
        if self._started_here:
            self._ray.shutdown()

    def describe(self) -> str:
        return f"ray, {self.workers} CPUs"


def make_backend(backend: str = "local", workers: int | None = None, address: str | None = None):
    if backend not in BACKENDS:
        raise InfersimError(f"unknown backend '{backend}'; known: {', '.join(BACKENDS)}")
    if workers is not None and workers < 1:
        raise InfersimError(f"--workers must be at least 1, got {workers}")
    if backend == "ray":
        return RayBackend(workers, address)
    if address:
        raise InfersimError("--address is for --backend ray")
    workers = workers or usable_cpus()
    return InlineBackend() if workers == 1 else LocalBackend(workers)


@dataclass(frozen=True)
class BackendOptions:
    """Where and how a search's simulations run: `sim plan`, `sim sweep` and the goodput
    comparison take the same flags."""

    backend: str = field(default="local", metadata={"help": "local (worker processes) or ray"})
    workers: int | None = field(default=None, metadata={"help": "worker processes; None: one per core"})
    address: str | None = field(default=None, metadata={"help": "ray cluster address (--backend ray)"})
    quiet: bool = field(default=True, metadata={"help": "no progress bar"})
    allow_large: bool = field(default=False, metadata={"help": "skip the up-front memory estimate (--no-memory-check)"})

    def make(self):
        return make_backend(self.backend, self.workers, self.address)
