"""The checkpoints of one training run: restore the newest, save, tidy up.

`RunCheckpoints` is what `trainer_lib.Trainer` restores and saves through;
the file-level work (damaged files skipped, another model's checkpoint
refused, killed saves' leftovers removed) is `checkpoints.py`'s:

  RestoreTraining()   newest intact checkpoint -> model, optimizer, step,
                      input position (None: a new run)
  RestoreForEval()    newest intact checkpoint -> model and step only
  Save()              ckpt-<step>; CheckpointWriteError keeps the previous one
  Tidy()              leftovers of killed saves removed, state file rebuilt
                      (only the logdir lock's holder: the files could be
                      another writer's)
"""

import os
from typing import Callable, Dict, Optional

import tensorflow as tf

from tensorpipe import checkpoints
from tensorpipe import errors
from tensorpipe import logdir as logdir_lib


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (disk full, permissions)."""


class RunCheckpoints:
  """Restores and saves the training state of one logdir.

  Usage:
    ckpts = RunCheckpoints(logdir, training_state, eval_state, lock, warn,
                           describe)
    path = ckpts.RestoreTraining()   # None: nothing to resume
    path = ckpts.Save(global_step)
    ckpts.latest                     # the newest restored or saved, or None

  Args of the constructor:
    logdir: the run's logdir (checkpoints in logdir/checkpoints).
    training_state: () -> the objects a training checkpoint holds, e.g.
      dict(model=, optimizer=, global_step=, train_iterator=); called once,
      at the first restore or save (the optimizer's slots and the input
      iterator exist by then).
    eval_state: () -> the objects an evaluation restores (model, step).
    lock: the logdir's lock; only its holder tidies the folder.
    warn: logs a warning line.
    describe: () -> 'a run of X ...' for a checkpoint that does not fit.
    max_to_keep: checkpoints kept (task.train.max_checkpoints_to_keep).
  """

  def __init__(self, logdir: str,
               training_state: Callable[[], Dict[str, tf.Module]],
               eval_state: Callable[[], Dict[str, tf.Module]],
               lock: logdir_lib.LogdirLock, warn: Callable[[str], None],
               describe: Callable[[], str], max_to_keep: int):
    self.directory = os.path.join(logdir, checkpoints.CHECKPOINT_DIR)
    self._training_state = training_state
    self._eval_state = eval_state
    self._lock = lock
    self._warn = warn
    self._describe = describe
    self._max_to_keep = max_to_keep
    self._roots = None
    self._ckpt = None
    self._eval_ckpt = None
    self._manager = None
    self.latest = None  # path of the newest checkpoint restored or saved

  def _Checkpoint(self) -> tf.train.Checkpoint:
    if self._ckpt is None:
      self._roots = self._training_state()
      self._ckpt = tf.train.Checkpoint(**self._roots)
    return self._ckpt

  def Tidy(self) -> None:
    """Removes killed saves' leftovers, rebuilds a damaged state file.

    Only the lock holder may do this: the files could be another writer's.
    """
    if self._lock.held:
      checkpoints.CleanUp(self.directory, self._warn)
      checkpoints.RepairStateFile(self.directory, self._warn)

  def RestoreTraining(self) -> Optional[str]:
    """Restores the newest intact checkpoint (model, optimizer, step, input
    position); returns its path, or None when there is none.

    Raises:
      checkpoints.IncompatibleCheckpointError: a run of another model.
      checkpoints.CheckpointError: checkpoint files exist, none is usable.
    """
    ckpt = self._Checkpoint()
    roots = {k: v for k, v in self._roots.items() if k != 'train_iterator'}
    path = checkpoints.RestoreNewest(ckpt, roots, self.directory,
                                     self._warn, self._describe)
    if path:
      self.latest = path
    return path

  def RestoreForEval(self) -> str:
    """Restores the eval state (model weights and step) only; its path.

    Raises:
      checkpoints.NoCheckpointError: the logdir has no checkpoint.
      checkpoints.CheckpointError: as RestoreTraining.
    """
    roots = self._eval_state()
    if self._eval_ckpt is None:
      self._eval_ckpt = tf.train.Checkpoint(**roots)
    path = checkpoints.RestoreNewest(self._eval_ckpt, roots, self.directory,
                                     self._warn, self._describe)
    if not path:
      raise checkpoints.NoCheckpointError(
          f'no checkpoint in {self.directory}: nothing to evaluate; '
          'check --logdir, or train first (--mode=train_and_eval)')
    return path

  def Save(self, step: tf.Variable) -> str:
    """Saves ckpt-<step>; returns its path.

    Raises:
      CheckpointWriteError: the files could not be written (disk full,
        permissions); earlier checkpoints are intact.
    """
    if self._manager is None:
      self.Tidy()
      self._manager = tf.train.CheckpointManager(
          self._Checkpoint(), self.directory, max_to_keep=self._max_to_keep,
          step_counter=step)
    try:
      previous = self.latest
      self.latest = self._manager.save(checkpoint_number=step)
      checkpoints.TestKillInSave(self.latest, previous)
      return self.latest
    except (tf.errors.OpError, OSError) as e:
      if self._lock.held:
        checkpoints.CleanUp(self.directory, self._warn)
      latest = checkpoints.CheckpointNumber(self.latest or '')
      kept = (f'the last checkpoint, ckpt-{latest}, is intact'
              if latest is not None else 'no earlier checkpoint exists')
      raise CheckpointWriteError(
          f'could not write the checkpoint of step {int(step.numpy())} in '
          f'{self.directory}: {errors.FirstLine(e)}; {kept}. Free space (or '
          'fix the permissions) and run again to resume') from None
