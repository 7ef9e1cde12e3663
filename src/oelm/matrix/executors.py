"""Executors decide only *where* a ready run trains; the plan (:mod:`oelm.matrix.plan`) decides
*what* is ready, and :func:`oelm.matrix.run_one.execute` trains it.

- :class:`LocalExecutor` (default): in this process, one run after another; Ray is never imported.
- :class:`RayExecutor`: each run a Ray task (``@ray.remote`` function with its CPU/GPU resources
  and ``max_retries``) on a local Ray instance or a cluster joined by address; one run at a time
  unless ``parallel`` says more, each with the local executor's thread count (the same numbers,
  bit for bit). A task whose worker process or node dies is started again by Ray and resumes from
  the run's own checkpoint; beyond the retries (or with the driver's own raylet dead) the matrix
  stops with one line naming the run (:class:`~oelm.errors.RunLostError`).

Why Ray tasks and not Ray Tune trials: the protocol (sweep, selection on validation, test once)
is oelm's own and written once in the plan; Tune would bring a second scheduler of trials, its own
result folders and its own search/selection, all of which oelm must not use. A task is the smallest
unit Ray schedules with resources and retries, which is all an executor needs.

An executor is used as::

    with make_executor(config.executor, config, log) as executor:   # checked, Ray joined: no file written yet
        ...                                                          # the output folder, the data
        executor.bind(ctx)
        with executor.running():                                     # runs in flight are cancelled on leaving
            executor.submit(task)                                    # as many as free_slots() allows
            for task, result in executor.wait(): ...                 # blocks until at least one finished

Everything an executor can refuse (threads or loader workers beyond the cores; for Ray: not
installed, an address that is unparsable, not set (``auto``) or not answering, resources no node
offers, more lanes than the cluster fits) is refused on entering, in one line, before the output
folder is touched or any data is prepared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol, runtime_checkable

import torch

from oelm.config import ExecutorConfig, ExperimentConfig
from oelm.errors import ConfigError, OELMError, RunLostError
from oelm.matrix.plan import RunTask
from oelm.matrix.ray_connect import check_resources, exit_on_signal, loopback_proxy, resolve_address, user_proxies
from oelm.matrix.run_one import RunContext, execute, placement_record, train_planned_run
from oelm.records import RunRecord

__all__ = ["Executor", "LocalExecutor", "RayExecutor", "make_executor", "cpu_cores", "default_threads"]

#: Environment variables a run needs on every node (data, caches, offline Hub, thread policy).
_FORWARDED_ENV = ("OELM_DATA_DIR", "OELM_CACHE_DIR", "HF_HUB_OFFLINE", "HF_HOME", "HF_DATASETS_OFFLINE",
                  "TRANSFORMERS_OFFLINE", "OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM")


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """Torch intra-op threads a run gets by default under every executor: this process's own
    setting (torch's default, or ``OMP_NUM_THREADS``). One number for all executors keeps a matrix's
    numbers bit-identical whichever executor trains it (a thread count changes the sums' order)."""
    return torch.get_num_threads()


def _most_workers(experiment: ExperimentConfig) -> int:
    """The largest ``training.num_workers`` of the matrix's methods ("auto" counts 0)."""
    return max((w for m in experiment.methods if isinstance(w := experiment.training_for(m).num_workers, int)), default=0)


def check_cores(config: ExecutorConfig, experiment: ExperimentConfig, cores: int) -> None:
    """Threads per run and DataLoader workers within this machine's ``cores``.

    Raises:
        ConfigError: one line naming the value, the cores, and the value to use.
    """
    if config.cpus_per_run and config.cpus_per_run > cores:
        raise ConfigError(f"--cpus-per-run {config.cpus_per_run:g} (executor.cpus_per_run): more threads than this "
                          f"machine's {cores} CPU cores; use --cpus-per-run {cores} or less")
    if _most_workers(experiment) > cores:
        raise ConfigError(f"training.num_workers={_most_workers(experiment)}: more DataLoader processes than this "
                          f"machine's {cores} CPU cores; use at most {cores}, or \"auto\"")


@contextlib.contextmanager
def torch_threads(threads: float | None) -> Iterator[None]:
    """Inside the block torch uses ``int(threads)`` threads (at least 1); as before afterwards. None
    or 0: unchanged."""
    if not threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@runtime_checkable
class Executor(Protocol):
    """What the driver (:mod:`oelm.matrix.driver`) asks of an executor: :class:`LocalExecutor` and
    :class:`RayExecutor` (the module docstring shows the calls in order). An executor decides only
    *where* a ready run trains; the plan decides what is ready."""

    #: ``executor.name`` of the config: ``"local"`` or ``"ray"``.
    name: str

    def __enter__(self) -> "Executor":
        """Check what this executor can refuse (one line, before the output folder is touched) and
        join its engine; the executor itself.

        Raises:
            ConfigError: threads, workers or resources this machine or cluster cannot give.
        """

    def __exit__(self, *exc: Any) -> None:
        """Let go of what ``__enter__`` joined (runs still queued are dropped)."""

    def bind(self, ctx: RunContext) -> None:
        """The matrix's runs share ``ctx`` (its data prepared)."""

    def running(self) -> ContextManager[None]:
        """A block in which runs are in flight: leaving it, by an error too, cancels those still running."""

    def free_slots(self, busy: int) -> int:
        """How many more runs may be submitted while ``busy`` are in flight (0 or less: none)."""

    def submit(self, task: RunTask) -> None:
        """Start one ready run (or queue it until :meth:`wait`)."""

    def wait(self) -> list[tuple[RunTask, RunRecord]]:
        """Block until at least one submitted run has finished; each finished task with its record.

        Raises:
            OELMError: a run's deliberate error, re-raised as its own type.
            RunLostError: a run whose process or node died beyond its retries.
        """


class LocalExecutor:
    """In this process, one run after another (``executor.cpus_per_run`` sets torch's threads for
    each run when given). Results are bit-identical to every earlier ``oelm run``.

    Raises:
        ConfigError: on entering, threads or ``training.num_workers`` beyond this machine's cores.
    """

    name = "local"

    def __init__(self, config: ExecutorConfig, experiment: ExperimentConfig, log: Callable[[str], None] = print) -> None:
        self.config, self.experiment, self._queue = config, experiment, []
        self.ctx: RunContext | None = None
        self._placement = placement_record("local", lanes=1, cpus_per_run=config.cpus_per_run or default_threads())

    def __enter__(self) -> "LocalExecutor":
        check_cores(self.config, self.experiment, cpu_cores())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._queue.clear()

    def bind(self, ctx: RunContext) -> None:
        """The matrix's runs share ``ctx`` (its data prepared)."""
        self.ctx = ctx

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        try:
            yield
        finally:
            self._queue.clear()

    def free_slots(self, busy: int) -> int:
        return 1 - busy

    def submit(self, task: RunTask) -> None:
        self._queue.append((task, time.time()))

    def wait(self) -> list[tuple[RunTask, RunRecord]]:
        task, submitted = self._queue.pop(0)
        self.ctx.placement = self._placement | {"submitted_unix": submitted}
        with torch_threads(self.config.cpus_per_run):
            return [(task, execute(self.ctx, task))]


def _ray_train(config: dict, out: str, task: dict, retry_failed: bool, allow_missing_weights: bool,
               placement: dict, threads: int) -> dict:
    """The Ray task: train exactly one planned run on whichever node Ray placed it. Returns
    ``{"result": ...}``, or ``{"error": {type, message, step, signal_name}}`` for an oelm error
    (re-raised by the driver as the same type: a deliberate error is not retried)."""
    import ray

    ctx = ray.get_runtime_context()
    placement = placement | {"node": platform.node(), "node_id": ctx.get_node_id(), "pid": os.getpid()}
    try:
        return {"result": train_planned_run(config, out, task, retry_failed=retry_failed,
                                            allow_missing_weights=allow_missing_weights, placement=placement,
                                            threads=threads)}
    except OELMError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc), "step": getattr(exc, "step", None),
                          "signal_name": getattr(exc, "signal_name", None), "kind": getattr(exc, "kind", None)}}


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _reraise(error: dict) -> None:
    """Raise the oelm error a Ray task reported (same class, message and fields)."""
    from oelm import errors

    cls = getattr(errors, error["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, OELMError)):
        cls = OELMError
    if issubclass(cls, errors.RunInterruptedError):
        raise cls(error["message"], step=error.get("step"), signal_name=error.get("signal_name") or "SIGTERM")
    if issubclass(cls, errors.RunFaultError):
        raise cls(error["message"], kind=error.get("kind") or "error", step=error.get("step"))
    raise cls(error["message"])


def _lost(task: RunTask, exc: BaseException, in_flight: int, retries: int) -> RunLostError:
    """The one line for a run whose Ray worker, raylet or node was lost (``exc``: Ray's error)."""
    what = {"WorkerCrashedError": f"its Ray worker process died {retries + 1} time(s) (executor.max_retries={retries})",
            "LocalRayletDiedError": "the Ray node it ran on was lost (its raylet died)",
            "NodeDiedError": "the Ray node it ran on was lost (marked dead)"}.get(type(exc).__name__)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    what = what or f"Ray lost it ({type(exc).__name__}{': ' + first[:160] if first else ''})"
    others = f" ({in_flight} other run(s) in flight stopped with it)" if in_flight else ""
    return RunLostError(f"run {task.name} was interrupted: {what}{others}; the finished runs are kept: "
                        "rerun the same command to continue")


class RayExecutor:
    """Each run a Ray task with ``num_cpus=cpus_per_run`` and ``num_gpus=gpus_per_run`` (several
    runs share a GPU with fractions), retried ``max_retries`` times when its process or node dies.
    One run at a time unless ``parallel`` says more; each run gets :func:`default_threads` torch
    threads unless ``cpus_per_run`` says otherwise, as under the local executor.

    Without ``address`` a local Ray instance is started (usage statistics off unless
    ``RAY_USAGE_STATS_ENABLED`` is set, no dashboard, bound to 127.0.0.1, this machine's cores) and
    stopped at the end; with ``HOST:PORT`` (or ``auto``: ``RAY_ADDRESS``) the driver joins that
    cluster, whose nodes must see the output folder (a shared file system) and the data.

    Raises:
        ConfigError: on entering, in one line (:mod:`oelm.matrix.ray_connect`): Ray is not
            installed; the address is ``auto`` without ``RAY_ADDRESS`` or does not answer; the
            cluster cannot be joined; a run needs more than any node has; ``parallel`` is more
            than the cluster fits.
        RunLostError: a run's worker crashed beyond ``max_retries``, or its node or raylet died:
            one line naming the run (from :meth:`wait` / :meth:`submit`).
    """

    name = "ray"

    def __init__(self, config: ExecutorConfig, experiment: ExperimentConfig, log: Callable[[str], None] = print) -> None:
        self.config, self.experiment, self.log = config, experiment, log
        self.ctx: RunContext | None = None
        self.cpus_per_run = config.cpus_per_run or float(default_threads())
        self.gpus_per_run = config.gpus_per_run
        self.lanes = config.parallel if isinstance(config.parallel, int) else 1
        self._refs: dict[Any, RunTask] = {}
        self._ray = None
        self._sigterm = None
        # The config as each task gets it: no progress bars from runs side by side (cosmetic keys only).
        cfg = experiment.model_dump(mode="json")
        cfg["training"]["progress_bar"] = False
        self._config = cfg

    def __enter__(self) -> "RayExecutor":
        local = not self.config.address
        if local:
            self._check_this_machine()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage statistics unless the user asks
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every run's own log lines, not "repeated 4x"
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        if local:
            # One node on loopback: Ray then takes 127.0.0.1 as it is instead of probing a public DNS
            # address for a "routable" one (read at import).
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError:
            raise ConfigError("executor ray needs Ray: pip install 'oelm[ray]' (or pip install ray), "
                              "or use the local executor") from None
        address = None if local else resolve_address(self.config.address)
        self._ray = ray
        self._connect(address)
        try:
            nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
            res = ray.cluster_resources()
            if self.config.parallel == "auto":
                self._choose_lanes(res)
            check_resources(nodes, self.cpus_per_run, self.gpus_per_run, self.lanes, _most_workers(self.experiment))
        except BaseException:
            self.__exit__()
            raise
        self.log(f"ray: {len(nodes)} node(s), {res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU; "
                 f"{self.cpus_per_run:g} CPU + {self.gpus_per_run:g} GPU per run, at most {self.lanes} at a time")
        return self

    def _check_this_machine(self) -> None:
        """A local instance: what this machine cannot give is refused before Ray starts."""
        check_cores(self.config, self.experiment, cpu_cores())
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        nodes = [{"CPU": float(cpu_cores()), "GPU": float(gpus)}]
        lanes = self.lanes if self.config.parallel != "auto" else 1
        check_resources(nodes, self.cpus_per_run, self.gpus_per_run, lanes, _most_workers(self.experiment))

    def _connect(self, address: str | None) -> None:
        """``ray.init``: join ``address`` (SIGTERM / SIGINT meanwhile end the process at once), or
        start a local instance on loopback with this machine's cores."""
        ray = self._ray
        env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
        env["RAY_USAGE_STATS_ENABLED"] = os.environ["RAY_USAGE_STATS_ENABLED"]
        kwargs: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=True, configure_logging=True)
        if address is not None:
            try:
                with exit_on_signal(f"joining the Ray cluster at {address}"):
                    ray.init(address=address, runtime_env={"env_vars": env}, **kwargs)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise ConfigError(f"--address {self.config.address}: could not join a Ray cluster at {address} "
                                  f"({type(exc).__name__}: {first}); is a Ray head there (ray start --head)?") from None
        else:
            env |= user_proxies()  # the runs see the user's own proxies
            with loopback_proxy():
                ray.init(address="local", num_cpus=cpu_cores(), include_dashboard=False, _node_ip_address="127.0.0.1",
                         runtime_env={"env_vars": env}, **kwargs)
        self._remote = ray.remote(_ray_train)
        # SIGTERM to the driver stops the matrix like Ctrl-C: __exit__ cancels the runs and stops
        # the local instance (no Ray process is left behind); each run continues from its last
        # checkpoint when the same command is rerun.
        if threading.current_thread() is threading.main_thread():
            self._sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)

    def __exit__(self, *exc: Any) -> None:
        if self._ray is None:
            return
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        self._cancel()
        self._ray.shutdown()
        self._ray = None

    def _cancel(self) -> None:
        for ref in list(self._refs):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._refs.clear()

    def bind(self, ctx: RunContext) -> None:
        """The matrix's runs share ``ctx`` (its output folder; the data is prepared on each node)."""
        self.ctx = ctx

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The runs submitted inside are cancelled when the block is left before they finished."""
        try:
            yield
        finally:
            if self._ray is not None:
                self._cancel()

    def free_slots(self, busy: int) -> int:
        return self.lanes - busy

    def _choose_lanes(self, resources: dict[str, float]) -> None:
        """``parallel: auto``, decided from the cluster's resources (no measurement) and said in one
        line: one run per GPU where the cluster has GPUs, else one run at a time with every thread.
        Two CPU runs side by side lost to one at a time on every CPU model measured here (a run's
        worker start and data preparation repeat per lane; docs/scaling.md, "The demo in lanes")."""
        gpus = int(resources.get("GPU", 0))
        if gpus:
            self.gpus_per_run = self.gpus_per_run or 1.0
            self.lanes = max(1, int(gpus / self.gpus_per_run))
            self.log(f"parallel auto: {self.lanes} lane(s), {self.gpus_per_run:g} GPU per run ({gpus} GPU(s) "
                     "in the cluster)")
        else:
            self.lanes = 1
            self.log(f"parallel auto: 1 lane x {self.cpus_per_run:g} thread(s): no GPU, and CPU runs side by side "
                     "were slower than one at a time here (docs/scaling.md); --parallel N sets the lanes")

    def submit(self, task: RunTask) -> None:
        placement = placement_record("ray", lanes=self.lanes, cpus_per_run=self.cpus_per_run,
                                     gpus_per_run=self.gpus_per_run, submitted_unix=time.time())
        try:
            ref = self._remote.options(
                num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run, max_retries=self.config.max_retries,
                retry_exceptions=False, name=f"oelm:{task.name}",
            ).remote(self._config, str(Path(self.ctx.out).resolve()), task.to_dict(), self.ctx.retry_failed,
                     self.ctx.allow_missing_weights, placement, max(1, int(self.cpus_per_run)))
        except self._ray.exceptions.RayError as exc:
            raise _lost(task, exc, len(self._refs), self.config.max_retries) from None
        self._refs[ref] = task

    def wait(self) -> list[tuple[RunTask, RunRecord]]:
        """The runs that finished (at least one; blocks until then).

        Raises:
            RunLostError: Ray lost a run (its worker beyond ``max_retries``, its raylet or node).
            OELMError subclasses: a run's own deliberate error, re-raised as the same type.
        """
        errors = self._ray.exceptions
        try:
            done, _ = self._ray.wait(list(self._refs), num_returns=1)
        except errors.RayError as exc:
            raise _lost(next(iter(self._refs.values())), exc, len(self._refs) - 1, self.config.max_retries) from None
        finished = []
        for ref in done:
            task = self._refs.pop(ref)
            try:
                payload = self._ray.get(ref)
            except errors.RayTaskError:
                raise  # an exception inside the run that is not oelm's: a bug, with its traceback
            except errors.RayError as exc:
                raise _lost(task, exc, len(self._refs), self.config.max_retries) from None
            if "error" in payload:
                _reraise(payload["error"])
            finished.append((task, payload["result"]))
        return finished


def make_executor(config: ExecutorConfig, experiment: ExperimentConfig, log: Callable[[str], None] = print) -> Executor:
    """The executor ``config`` names for the matrix of ``experiment`` (not entered yet)."""
    if config.name == "ray":
        return RayExecutor(config, experiment, log)
    return LocalExecutor(config, experiment, log)
