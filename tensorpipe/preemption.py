"""Stopping a run on SIGTERM / SIGINT: finish the step, save, exit 128 + N.

What a preemptible VM, Kubernetes or Slurm sends is SIGTERM, some seconds
before SIGKILL; Ctrl-C is SIGINT. `StopSignals` turns either into a request
that the training loop (trainer_lib.Trainer) polls between steps:

  signal before the first step of this process   exit at once (nothing new)
  signal during a step                           the step ends, the chief
                                                 saves ckpt-N, every worker
                                                 exits 128 + N (143 / 130)
  signal during evaluation                       the evaluation ends early
                                                 (no eval results), then save
  signal during a save                           the save finishes first
  a second signal                                exit at once, no save
  signal during a cluster's registration         exit when TF's call
    (`Hold` ... `Release`)                       returns (cluster.py)

In a multi-worker run the workers must stop after the same step, or one of
them waits forever in the next all-reduce. Every step all-reduces the loss
weight (distribute.TrainStep); the stop flag rides along in that same
collective (`TrainStep(..., stop=...)` returns the sum of every worker's
flag), so all workers see the same vote after the step and stop together,
one step after the first worker was signalled at the latest.

Why not tf.distribute.experimental.PreemptionCheckpointHandler: it is
documented for MultiWorkerMirroredStrategy and TPUStrategy only (a
single-process run has neither) and handles SIGTERM only; it restores at
construction through CheckpointManager.restore_or_initialize, bypassing
checkpoints.RestoreNewest (damaged files skipped, another model's checkpoint
refused); it adds a `checkpointed_runs` variable, so checkpoints of earlier
runs no longer restore; non-chief workers write checkpoints of their own;
and it ends the process with sys.exit(42). The all-reduced flag costs one
float per step and keeps one code path for R = 1 and R > 1.

TensorFlow's C++ preemption notifier installs its own SIGTERM handler when
the coordination service of a multi-worker run starts: `Install` must run
after the strategy exists (it re-installs Python's handler over TF's).
"""

import os
import signal
import sys
from typing import Callable, IO, Optional, Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def SignalName(signum: int) -> str:
  try:
    return signal.Signals(signum).name
  except ValueError:
    return f'signal {signum}'


def ExitCode(signum: int) -> int:
  """128 + N, what a shell reports for a process ended by signal N."""
  return 128 + int(signum)


def StopAgreed(votes: float, requested: bool, num_replicas: int,
               num_local_replicas: int) -> bool:
  """The stop vote after a step: whether this process stops now.

  Args:
    votes: the step's STOP_VOTES, every replica's stop flag summed in the
      step's all-reduce (distribute.TrainStep).
    requested: whether this process has a stop request (`StopSignals`).
    num_replicas, num_local_replicas: R in all and in this process.

  With other processes only the votes count, the same number on every
  worker: a worker that was not signalled stops with the one that was
  (else it would wait in the next all-reduce forever), and a request that
  came after the step's vote waits for the next step's. In one process the
  request itself counts (also one made during an evaluation).
  """
  if num_replicas > num_local_replicas:
    return votes > 0
  return requested


class StopRequested(Exception):
  """Training stopped on a signal after saving; the run can be resumed.

  Attributes:
    signum: the signal (None on a worker that was not signalled itself but
      stops because another worker was).
    step: the step reached (and saved, on the chief).
    checkpoint: path of the checkpoint of `step`, or None (not the chief).
    exit_code: 128 + signum (143 for SIGTERM, 130 for SIGINT); 143 on a
      worker stopped by another worker's signal.
  """

  def __init__(self, signum: Optional[int], step: int,
               checkpoint: Optional[str], what: str = 'at step'):
    self.signum = signum
    self.step = step
    self.checkpoint = checkpoint
    self.exit_code = ExitCode(signum or signal.SIGTERM)
    cause = (SignalName(signum) if signum else
             'another worker\'s stop signal')
    saved = (f'saved {os.path.basename(checkpoint)}' if checkpoint else
             'the chief saved the checkpoint')
    super().__init__(f'stopped by {cause} {what} {step}; {saved}; run the '
                     'same command to resume')


class StopSignals:
  """Records SIGTERM / SIGINT for a training loop to act on between steps.

  Usage:
    stop = preemption.StopSignals()
    stop.Install()              # in the main thread, after the strategy
    ...                         # exists
    stop.Arm()                  # after the first step: from now on a signal
    if stop.requested: ...      # asks for a stop instead of exiting
    stop.Uninstall()

  Before `Arm()` (nothing trained yet) a signal exits the process at once
  with one line; so does a second signal after a first one was recorded.
  """

  # What the line of a signal before `Arm()` says after "stopped by SIGTERM".
  BEFORE_FIRST_STEP = ('before the first step: nothing new to save; run the '
                       'same command to resume')

  def __init__(self, signals: Sequence[int] = STOP_SIGNALS,
               prog: str = 'trainer', out: Optional[IO[str]] = None,
               exit_fn: Callable[[int], None] = os._exit,
               unarmed: str = BEFORE_FIRST_STEP):
    """unarmed: the rest of the line of a signal before `Arm()`, e.g. for
    a run that only evaluates."""
    self._signals = tuple(signals)
    self._unarmed = unarmed
    self._prog = prog
    self._out = out
    self._exit = exit_fn
    self._signum = None
    self._armed = False
    self._old = {}

  @property
  def requested(self) -> bool:
    return self._signum is not None

  @property
  def signum(self) -> Optional[int]:
    return self._signum

  @property
  def armed(self) -> bool:
    return self._armed

  def Install(self) -> 'StopSignals':
    """Installs the handlers (main thread only); may be called again to take
    the signals back from TensorFlow's preemption notifier."""
    for s in self._signals:
      old = signal.signal(s, self._Handle)
      self._old.setdefault(s, old)
    return self

  def Hold(self) -> None:
    """Blocks the signals in this thread until `Release`.

    A signal that comes meanwhile waits (pending), and every thread started
    meanwhile inherits the mask and never takes it: for a start-up whose
    C++ calls hold the GIL with TensorFlow's preemption notifier on SIGTERM
    (a cluster's registration, cluster.py). Call in the main thread before
    TensorFlow starts its threads.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)

  def Release(self) -> None:
    """Unblocks the signals in this thread: a pending one is handled now by
    the handler installed (`Install` first, to take SIGTERM back from TF)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, self._signals)

  def Uninstall(self) -> None:
    for s, old in self._old.items():
      signal.signal(s, old if old is not None else signal.SIG_DFL)
    self._old = {}

  def Arm(self, armed: bool = True) -> None:
    """From now on a first signal asks for a stop instead of exiting."""
    self._armed = armed

  def _Print(self, line: str) -> None:
    out = self._out or sys.stderr
    try:
      out.write(f'{self._prog}: {line}\n')
      out.flush()
    except (OSError, ValueError):
      pass  # a closed stream must not keep the process alive

  def _Handle(self, signum, frame) -> None:
    del frame  # unused
    name = SignalName(signum)
    if self._signum is not None:
      self._Print(f'second signal ({name}): exiting at once without saving')
      self._exit(ExitCode(signum))
      return
    if not self._armed:
      self._Print(f'stopped by {name} {self._unarmed}')
      self._exit(ExitCode(signum))
      return
    self._signum = signum
    self._Print(f'{name} received: finishing the current step, then saving '
                'a checkpoint (send it again to exit at once)')
