"""Starting or joining Ray without hanging and without leaving this machine: the checks the Ray
executor (:mod:`oelm.matrix.executors`) makes before it starts anything, each a one-line
:class:`~oelm.errors.ConfigError` naming the value and the fix.

- :func:`resolve_address`: ``auto`` joins the cluster ``RAY_ADDRESS`` names and is refused without
  it (Ray's own ``auto`` joins whichever instance was started last on this machine, another
  user's included); ``HOST:PORT`` must answer a TCP connection within :data:`CONNECT_SECONDS`
  (Ray itself retries an address with nothing listening for ~40 s).
- :func:`exit_on_signal`: SIGTERM / SIGINT while joining a cluster ends the process at once (Ray's
  connection waits in C++, where Python's signal handlers do not run).
- :func:`check_resources`: a run that no node can take (GPUs on a CPU cluster, more CPUs than the
  largest node) or more lanes than the cluster fits would wait forever in Ray's queue.
- :func:`loopback_proxy`: a local instance's start-up sends nothing off the machine.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import socket
import sys
import threading
from typing import Any, Iterator

from oelm.config import parse_ray_address
from oelm.errors import ConfigError

__all__ = ["CONNECT_SECONDS", "resolve_address", "exit_on_signal", "check_resources", "loopback_proxy"]

#: Seconds a cluster's address has to accept a TCP connection before it is called unreachable.
CONNECT_SECONDS = 5.0

_PROXY_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")


def resolve_address(address: str) -> str:
    """The ``HOST:PORT`` (or ``ray://HOST:PORT``) to join for ``executor.address``, checked to
    answer: ``auto`` is ``RAY_ADDRESS``.

    Raises:
        ConfigError: ``auto`` without ``RAY_ADDRESS``; an unparsable ``RAY_ADDRESS``; an unknown
            host; nothing listening (connection refused); no answer within :data:`CONNECT_SECONDS`.
    """
    flag = f"--address {address}"
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "").strip()
        if not address:
            raise ConfigError("--address auto joins the cluster RAY_ADDRESS names, and RAY_ADDRESS is not set: give the "
                              "head's HOST:PORT (`ray start --head` prints it), or set RAY_ADDRESS")
        flag = f"RAY_ADDRESS={address}"
        if parse_ray_address(address) is None:
            raise ConfigError(f"{flag}: not HOST:PORT or ray://HOST:PORT; set it to the address `ray start --head` printed")
    _, host, port = parse_ray_address(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            pass
    except socket.gaierror as exc:
        raise ConfigError(f"{flag}: unknown host {host} ({exc.strerror or exc}); fix the address") from None
    except ConnectionRefusedError:
        raise ConfigError(f"{flag}: nothing listens at {host}:{port} (connection refused); start the cluster's head "
                          f"there (ray start --head --port={port}) or fix the address") from None
    except (socket.timeout, TimeoutError):
        raise ConfigError(f"{flag}: no answer from {host}:{port} within {CONNECT_SECONDS:g} s (a wrong host, or a "
                          "firewall); fix the address") from None
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot reach {host}:{port} ({exc.strerror or exc}); fix the address") from None
    return address


@contextlib.contextmanager
def exit_on_signal(what: str) -> Iterator[None]:
    """While the block runs, SIGTERM or SIGINT prints ``oelm: interrupted: SIGTERM while <what>;
    ...`` and ends the process at once (exit status 130), even while the main thread waits in a
    C call: the signal's byte arrives on a wakeup pipe (:func:`signal.set_wakeup_fd`) that a
    watching thread reads. Use it only where nothing has been started or written. Only the main
    thread may set the pipe; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if not select.select([read_fd], [], [], 0.1)[0]:
                continue
            for signum in os.read(read_fd, 64):
                if signum in (signal.SIGTERM, signal.SIGINT) and not done.is_set():
                    sys.stderr.write(f"oelm: interrupted: {signal.Signals(signum).name} while {what}; nothing was "
                                     "started or written: rerun the same command to start again\n")
                    sys.stderr.flush()
                    os._exit(130)

    watcher = threading.Thread(target=watch, name="oelm-signal-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        watcher.join()
        os.close(read_fd)
        os.close(write_fd)


def check_resources(nodes: list[dict[str, float]], cpus: float, gpus: float, lanes: int,
                    num_workers: int = 0) -> None:
    """Refuse what no node of the cluster can give (``nodes``: each live node's resources, Ray's
    ``{"CPU": n, "GPU": n}``): ``cpus`` / ``gpus`` per run, ``lanes`` runs at once, ``num_workers``
    DataLoader processes beside a run's threads.

    Raises:
        ConfigError: one line naming the value, what the cluster has, and the value to use.
    """
    where = f"the Ray cluster ({len(nodes)} node(s), {sum(n.get('CPU', 0) for n in nodes):g} CPU, " \
            f"{sum(n.get('GPU', 0) for n in nodes):g} GPU)"
    most_cpu = max((n.get("CPU", 0) for n in nodes), default=0)
    most_gpu = max((n.get("GPU", 0) for n in nodes), default=0)
    if gpus > 0 and most_gpu == 0:
        raise ConfigError(f"--gpus-per-run {gpus:g}: {where} has no GPU; leave --gpus-per-run out (executor.gpus_per_run: 0), "
                          "or join a cluster with GPUs (--address)")
    if gpus > most_gpu:
        raise ConfigError(f"--gpus-per-run {gpus:g}: no node of {where} has that many GPUs (the largest has "
                          f"{most_gpu:g}); use --gpus-per-run {most_gpu:g} or less")
    if cpus > most_cpu:
        raise ConfigError(f"--cpus-per-run {cpus:g}: no node of {where} has that many CPUs (the largest has "
                          f"{most_cpu:g}); use --cpus-per-run {most_cpu:g} or less")
    if num_workers > most_cpu:
        raise ConfigError(f"training.num_workers={num_workers}: more DataLoader processes than the largest node of {where} "
                          f"has CPUs ({most_cpu:g}); use at most {int(most_cpu)}, or \"auto\"")
    fits = sum(math.floor(n.get("CPU", 0) / cpus + 1e-9) if cpus else lanes for n in nodes)
    if gpus > 0:
        fits = min(fits, sum(math.floor(n.get("GPU", 0) / gpus + 1e-9) for n in nodes))
    if lanes > fits:
        per_run = f"{cpus:g} CPU" + (f" + {gpus:g} GPU" if gpus else "")
        raise ConfigError(f"--parallel {lanes}: {where} fits at most {fits} run(s) of {per_run} at once; use --parallel "
                          f"{max(fits, 1)} or less" + (" (or fewer --cpus-per-run)" if cpus > 1 else ""))


@contextlib.contextmanager
def loopback_proxy() -> Iterator[None]:
    """While a local Ray instance starts: HTTP(S) through a closed port on 127.0.0.1, loopback
    exempt. Ray's head process looks up cloud metadata (169.254.169.254, metadata.google.internal)
    at start-up even with usage statistics off; this keeps a local instance from sending anything
    off the machine. The variables are restored at once; runs get the user's own (runtime_env)."""
    saved = {k: os.environ.get(k) for k in _PROXY_ENV}
    os.environ.update({"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
                       "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
                       "no_proxy": "localhost,127.0.0.1,::1", "NO_PROXY": "localhost,127.0.0.1,::1"})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def user_proxies() -> dict[str, Any]:
    """The user's own proxy settings (what the runs see)."""
    return {k: os.environ.get(k, "") for k in _PROXY_ENV}
