"""A training run's life cycle around the Trainer: start and finish.

The order of a run's start and end lives here, in one place; the trainer
binary (tools/trainer.py) is flags, then `RunLifeCycle`, then the Trainer:

  life = RunLifeCycle(logdir, cluster, stop, take_lock=mode != 'eval',
                      peer_wait_s=60.0)
  topology = life.Start(params, num_partitions, num_replicas, step_flags,
                        setup_devices)
    lock the logdir (the chief, training only)          logdir.LogdirLock
    setup_devices()        logical devices, determinism: before any TF op
    [cluster] signals released, wait for every peer's port, held again
                                                        peer_wait.py
    topology (a cluster registers with TF's coordination service here)
                                                        distribute.py
    signal handlers re-installed over TF's preemption notifier, released:
      a signal held meanwhile acts now (exit before the first step)
                                                        preemption.py
    [cluster] every worker agrees on its Params and step flags, through
      the coordination store                            worker_agreement.py
  ... Trainer(params, logdir, topology=topology, lock=life.lock, stop=stop)
  life.Finish(exit_code)       after the run ended (done, or stopped)
    [cluster, chief] set the chief-done key; wait until the other workers'
      ports close; unlock the logdir; exit at once with exit_code
    [cluster, other] wait for the chief-done key (60 s), then exit at once
      with exit_code (os._exit: every file was closed before Finish)
    [one process] unlock the logdir
  life.Unlock()                on every other way out (idempotent)

A failed start raises `StartError`, one line naming the cause (a peer that
never came, a registration TF gave up on, workers that disagree), after
releasing the lock; a locked logdir raises logdir.LogdirLockedError. Every
side effect is injectable (`Steps`), so the unit tests run start and finish
in one process with an in-memory store (tests/run_life_cycle_test.py).

Why "leave last": the chief hosts TF's coordination service. A worker still
tearing TF down after the chief has gone logs "Failed to send RPC to
coordination service ... Connection refused", and one whose teardown stops
its heartbeats makes the chief log "tasks are unhealthy". So the other
workers wait until the chief has finished (its last save can take seconds
on a loaded machine, and a worker gone for the 10 s heartbeat timeout is
reported as unhealthy; a waiting worker still sends heartbeats), then end
at once, and the chief waits until their ports close, then ends at once
too: its service declares a worker unhealthy once that worker's last
heartbeat is older than the timeout, however the worker left.
"""

import dataclasses
import os
import sys
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from tensorpipe import cluster as cluster_lib
from tensorpipe import distribute
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import params_format
from tensorpipe import peer_wait
from tensorpipe import preemption
from tensorpipe import worker_agreement

# Set by the chief when it has finished; the other workers wait for it.
CHIEF_DONE_KEY = 'tensorpipe/trainer/chief_done'
# How long a worker waits for the chief to finish, and the chief for the
# workers' ports to close.
CHIEF_DONE_WAIT_S = 60.0
WORKERS_EXIT_WAIT_S = 30.0


class StartError(Exception):
  """The run cannot start (peers, registration, agreement): one line."""


class CoordinationStore:
  """TF's coordination service key-value store, the one user of its API.

  Every multi-worker run has it (the chief hosts the service once the
  strategy exists). Private TF API, used only here:

    API                                       user             breaks test
    context.context().set_config_key_value    Set              multiworker_
    context.context().get_config_key_value    Get (blocking)   slow_test.py

  Tests pass an in-memory store with the same two methods instead.
  """

  def Set(self, key: str, value: str) -> None:
    context.context().set_config_key_value(key, value)

  def Get(self, key: str, timeout_s: float) -> str:
    """The key's value, waiting up to `timeout_s` for a peer to set it."""
    return context.context().get_config_key_value(key, int(timeout_s * 1000))


@dataclasses.dataclass
class Steps:
  """The side effects of a life cycle; tests replace them with fakes."""
  wait_for_peers: Callable = peer_wait.WaitForPeers
  wait_for_exit: Callable = peer_wait.WaitForExit
  make_topology: Callable = distribute.MakeTopology
  store: Any = dataclasses.field(default_factory=CoordinationStore)
  exit_fn: Callable[[int], None] = os._exit  # pylint: disable=protected-access


class RunLifeCycle:
  """Starts and finishes one run (see the module docstring for the order).

  Args of the constructor:
    logdir: the run's logdir.
    cluster: a `cluster.Cluster`, or None for one process.
    stop: the run's StopSignals, installed, with SIGTERM / SIGINT blocked
      in this thread when there is a cluster (tools/trainer.py blocks them
      before TensorFlow starts a thread).
    take_lock: whether this run trains (an evaluation takes no lock); only
      the chief of a cluster takes it.
    peer_wait_s: seconds to wait for the peers' ports, for TF's
      registration and for each worker's agreement digests.
    log, warn: log an info / a warning line.
    lock: the logdir's lock (default a new LogdirLock).
    steps: the side effects (default the real ones).
  """

  def __init__(self, logdir: str, cluster: Any,
               stop: preemption.StopSignals, take_lock: bool,
               peer_wait_s: float,
               log: Callable[[str], None] = logging.info,
               warn: Callable[[str], None] = logging.warning,
               lock: Optional[logdir_lib.LogdirLock] = None,
               steps: Optional[Steps] = None):
    self._cluster = cluster
    self._stop = stop
    self._take_lock = take_lock and (cluster is None or cluster.is_chief)
    self._peer_wait_s = peer_wait_s
    self._log = log
    self._warn = warn
    self.lock = lock or logdir_lib.LogdirLock(logdir)
    self._steps = steps or Steps()

  def Start(self, params: hyperparams.Params, num_partitions: int,
            num_replicas: int, step_flags: Dict[str, str],
            setup_devices: Callable[[], None]) -> Any:
    """Locks, connects and checks; returns the run's distribute.Topology.

    Args:
      params: the run's Params (overrides applied).
      num_partitions: K of the run's pipelines.
      num_replicas: --num_replicas (R in one process; must be 1 with a
        cluster, whose R is its number of workers).
      step_flags: the flags every worker must share
        (worker_agreement.StepFlagValues).
      setup_devices: configures TF's devices; runs after the lock and
        before any TF op.

    Raises:
      logdir.LogdirLockedError, OSError: the logdir is locked or unusable.
      StartError: one line: a peer did not come, TF's registration failed,
        or the workers disagree (the lock is released).
      ValueError: from MakeTopology (R, K and the devices do not fit).
    """
    if self._take_lock:
      # First of all, so that a second trainer on this logdir stops at once;
      # held until Finish / Unlock (the kernel drops it if the process is
      # killed).
      self.lock.Acquire()
    try:
      setup_devices()
      topology = self._Connect(num_partitions, num_replicas)
      if self._cluster is not None:
        self._CheckWorkersAgree(params, step_flags)
    except StartError:
      self.Unlock()
      raise
    return topology

  def _Connect(self, num_partitions: int, num_replicas: int) -> Any:
    """Peers, topology, signal handlers: the order the cluster needs."""
    timeouts = None
    if self._cluster is not None:
      self._stop.Release()  # the peer wait is Python: a signal acts at once
      try:
        self._WaitForPeers()
      finally:
        self._stop.Hold()
      timeouts = cluster_lib.FaultTimeouts(
          cluster_register_timeout_s=self._peer_wait_s)
    try:
      return self._MakeTopology(num_partitions, num_replicas, timeouts)
    finally:
      # Again: a cluster's coordination service gave SIGTERM to TF's
      # preemption notifier. Then a signal held during the registration
      # acts (exit 143 / 130 before the first step).
      self._stop.Install()
      self._stop.Release()

  def _WaitForPeers(self) -> None:
    cluster = self._cluster
    own = cluster.tasks[cluster.worker_index]
    try:
      seconds = self._steps.wait_for_peers(own, self._Peers(),
                                           self._peer_wait_s, self._log)
    except (peer_wait.PeersMissingError, peer_wait.PortInUseError) as e:
      raise StartError(f'{type(e).__name__}: {e}') from None
    self._log(f'{own[0]}: every worker answers ({seconds:.1f} s)')

  def _Peers(self):
    cluster = self._cluster
    return [t for i, t in enumerate(cluster.tasks)
            if i != cluster.worker_index]

  def _MakeTopology(self, num_partitions: int, num_replicas: int,
                    timeouts: Any) -> Any:
    """make_topology; a cluster's failed registration -> StartError naming
    the peers (cluster.RegistrationError)."""
    try:
      return self._steps.make_topology(num_replicas, num_partitions,
                                       self._cluster, timeouts)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
      if self._cluster is None:
        raise
      raise StartError(cluster_lib.RegistrationError(
          self._cluster, e.message, self._peer_wait_s)) from None

  def _CheckWorkersAgree(self, params: hyperparams.Params,
                         step_flags: Dict[str, str]) -> None:
    """Every worker runs the same Params and step flags, or all stop here."""
    text = params.ToText()
    values = dict(params_format.TextValues(text), **step_flags)
    cluster = self._cluster
    try:
      worker_agreement.CheckAgreement(
          cluster.worker_index, cluster.num_workers,
          worker_agreement.KeyDigests(text, step_flags),
          worker_agreement.StoreExchange(self._steps.store,
                                         cluster.num_workers,
                                         self._peer_wait_s),
          values)
    except ValueError as e:
      raise StartError(f'ValueError: {e}') from None

  def Finish(self, exit_code: int) -> None:
    """Ends a run that finished or stopped: leave last, then unlock.

    In a cluster this does not return: a worker other than the chief exits
    with `exit_code` once the chief is done, the chief once they have gone.
    """
    if self._cluster is not None:
      self._LeaveLast(exit_code)
    self.Unlock()

  def _LeaveLast(self, exit_code: int) -> None:
    store = self._steps.store
    if not self._cluster.is_chief:
      try:
        store.Get(CHIEF_DONE_KEY, CHIEF_DONE_WAIT_S)
      except Exception:  # pylint: disable=broad-except
        pass  # the chief has gone or is stuck: leave now, as before
      _FlushOutput()
      self._steps.exit_fn(exit_code)
      return
    try:
      store.Set(CHIEF_DONE_KEY, '1')
    except Exception:  # pylint: disable=broad-except
      pass  # a worker then leaves after its 60 s wait
    left = self._steps.wait_for_exit(self._Peers(),
                                     timeout_s=WORKERS_EXIT_WAIT_S)
    if left:
      self._warn(f'{", ".join(left)} still running '
                 f'{WORKERS_EXIT_WAIT_S:.0f} s after this worker finished')
    # The chief, too, ends at once: its coordination service declares a
    # worker that exited unhealthy once that worker's last heartbeat is
    # older than the timeout, and Python's and TF's teardown took that long
    # on a loaded machine (CI: "The following tasks are unhealthy"). Every
    # file was closed before Finish (checkpoints, summaries, eval results).
    self.Unlock()
    _FlushOutput()
    self._steps.exit_fn(exit_code)

  def Unlock(self) -> None:
    """Releases the logdir's lock if this process holds it."""
    self.lock.Release()


def _FlushOutput() -> None:
  """Flushes what the process printed and logged, before os._exit."""
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
