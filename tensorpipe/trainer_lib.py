"""Training and evaluation loops: checkpoints, summaries, resume, metrics.

`Trainer(params, logdir)` builds the task, inputs and optimizer from an
experiment's Params (`BaseExperiment.ModelParams()`, overrides) and runs:

  lock the logdir (logdir.LogdirLock: one trainer per logdir; the chief only)
  check the inputs against the model (batch keys, micro-batches, eval length)
  restore the newest intact checkpoint (model, optimizer, step, the input
    iterator's position) if there is one (checkpoints.RestoreNewest: damaged
    files are skipped with a warning, another model's checkpoint is refused)
  write params.txt (a changed predecessor kept as params.<step>.txt)
  while step < max_steps:
    batch = next(train iterator)
    with StepSeed(step), DropPathProgress(step / max_steps):
      in each of the R replicas (distribute.TrainStep, R = 1 by default):
        loss, grads of its rows [r N/R, (r+1) N/R) of the batch
        grads = all-reduce(grads) over the replicas
        clip grads by global norm; optimizer.Apply(lr_schedule(step), grads)
    stop (NonFiniteError) if the loss or any weight or slot is not finite
    log / write summaries / save a checkpoint at their intervals
    on SIGTERM / SIGINT (preemption.StopSignals; every worker agrees through
      the step's all-reduce): leave the loop after this step
  save a checkpoint; evaluate on the eval input (or raise StopRequested)

A checkpoint is saved only after the check of its step, so the newest
checkpoint is always finite. Evaluation (`Evaluate`) takes no lock and writes
nothing but eval summaries and eval_metrics.json; `Evaluate(restore=True)`
refuses a logdir without a checkpoint.

Randomness inside the model (dropout) depends only on the layer seeds and the
step, and the input position is in the checkpoint, so with
`EnableDeterminism()` a run killed and restarted ends with exactly the weights
of an uninterrupted run.
"""

import os
import time
from typing import Any, Dict, List, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import base_layer
from tensorpipe import distribute
from tensorpipe import evaluation
from tensorpipe import finite_check
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import precise_bn
from tensorpipe import preemption
from tensorpipe import py_utils
from tensorpipe import run_checkpoints
from tensorpipe import schedule_auto
from tensorpipe import summaries
from tensorpipe import train_params
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap

# Key of TrainStep's result: True if every weight and slot is finite.
WEIGHTS_FINITE = 'weights_finite'


def EnableDeterminism(seed: int) -> None:
  """Deterministic ops and fixed global seeds (call before building)."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  tf.config.experimental.enable_op_determinism()


def _Scalars(metrics: Dict[str, Any]) -> Dict[str, float]:
  return {k: float(v) for k, v in metrics.items()}


class Trainer:
  """Trains and evaluates one experiment in one logdir.

  Usage:
    p = model_registry.GetExperiment(key).ModelParams()
    trainer = Trainer(p, logdir)
    trainer.Train()          # locks the logdir; resumes from its checkpoints
    metrics = trainer.Evaluate(restore=False)   # the weights just trained

  Constructing a Trainer writes nothing; `Train` takes the logdir's lock for
  its duration unless `Lock()` was called before (then `Unlock()` releases
  it). In a multi-worker run pass `is_chief=False` on every worker but the
  chief: those take no lock, write no params.txt and clean up nothing.
  """

  def __init__(self, params: hyperparams.Params, logdir: str,
               log_fn=None, is_chief: Optional[bool] = None,
               topology: Optional[distribute.Topology] = None,
               lock: Optional[logdir_lib.LogdirLock] = None,
               stop: Optional[preemption.StopSignals] = None):
    self._params = params.Copy()
    self._logdir = logdir
    self._log = log_fn or logging.info
    # schedule='auto' becomes the planner's schedule here, so params.txt,
    # a resume and an export read the concrete one.
    schedule_auto.ResolveAutoIn(self._params, self._log)
    # Every step runs in a strategy: R = 1 without a cluster, so one code
    # path (tensorpipe/distribute.py).
    self.topology = topology or distribute.SingleReplicaTopology()
    self._is_chief = bool(self.topology.is_chief if is_chief is None
                          else is_chief)
    p = self._params
    tp = p.task.train
    train_params.CheckTrainParams(tp)
    # `lock`: the caller's LogdirLock of this logdir, possibly already held
    # (the trainer binary takes it before building anything).
    self._lock = lock or logdir_lib.LogdirLock(logdir, log_fn=self._Warn)
    # `stop`: SIGTERM / SIGINT requests, polled between steps and eval
    # batches (preemption.py); None: signals keep their default action.
    self._stop = stop

    # One task and optimizer per local replica, on its device group; the
    # checkpoint holds replica 0's (all replicas hold the same values).
    self._tasks = distribute.BuildReplicas(p.task, self.topology)
    self._optimizers = [tp.optimizer.Instantiate() for _ in self._tasks]
    self.task = self._tasks[0]
    self.optimizer = self._optimizers[0]
    self.lr_schedule = tp.lr_schedule.Instantiate()
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name='global_step')
    self._train_input = None
    self._train_ds = None
    self._train_iter = None
    self._eval_input = None
    self._train_fn = None
    self._eval_fn = None
    self._checkpoints = run_checkpoints.RunCheckpoints(
        logdir, self._TrainingState, lambda: dict(
            model=self.task, global_step=self.global_step), self._lock,
        self._Warn,
        # 'a run of X' for the error of a checkpoint that does not fit.
        lambda: logdir_lib.RunDescription(logdir, self._params.ToText()),
        tp.max_checkpoints_to_keep)
    self._checked_train_input = False
    self._checked_eval_input = False

  @property
  def params(self) -> hyperparams.Params:
    return self._params

  @property
  def logdir(self) -> str:
    return self._logdir

  @property
  def latest_checkpoint(self) -> Optional[str]:
    """The newest checkpoint restored or saved by this trainer, or None."""
    return self._checkpoints.latest

  def _Warn(self, message: str) -> None:
    self._log(f'WARNING: {message}')

  # -- the logdir --------------------------------------------------------------

  def Lock(self) -> None:
    """Takes the logdir's lock (chief only); creates the logdir.

    Raises:
      logdir.LogdirLockedError: another trainer holds it (names PID and host).
      OSError: the logdir cannot be created or written.
    """
    if self._is_chief:
      self._lock.Acquire()

  def Unlock(self) -> None:
    self._lock.Release()

  # -- inputs and checkpoints --------------------------------------------

  def TrainInput(self):
    if self._train_input is None:
      self._train_input = self._params.input.Instantiate()
    return self._train_input

  def EvalInput(self):
    if self._eval_input is None:
      self._eval_input = self._params.eval_input.Instantiate()
    return self._eval_input

  def _TrainDataset(self) -> tf.data.Dataset:
    if self._train_ds is None:
      self._train_ds = self.TrainInput().Dataset()
    return self._train_ds

  def _TrainIterator(self):
    if self._train_iter is None:
      self._train_iter = iter(self._TrainDataset())
    return self._train_iter

  def CheckInputs(self, train: bool = True, evaluate: bool = True) -> None:
    """Builds the inputs and checks them against the model, before any step.

    Catches here, with one-line errors, what would otherwise fail inside the
    traced step or never end: a batch key the task reads that the input does
    not give, a batch size the model's pipeline cannot split into its
    micro-batches, and an eval input that repeats forever while
    task.train.eval_steps is None.

    Raises:
      ValueError: one of the above, naming the value and the fix.
      FileNotFoundError / base_input.DataFileError: missing or damaged data.
    """
    if train and not self._checked_train_input:
      self._CheckInput(self._TrainDataset(), 'input')
      self._checked_train_input = True
    if evaluate and not self._checked_eval_input:
      ds = self.EvalInput().Dataset()
      self._CheckInput(ds, 'eval_input')
      self._CheckEvalEnds(ds, self._params.task.train.eval_steps)
      self._checked_eval_input = True

  def _CheckEvalEnds(self, ds: tf.data.Dataset,
                     eval_steps: Optional[int]) -> None:
    if (eval_steps is None and
        ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY):
      ep = self._params.eval_input
      raise ValueError(
          f'the eval input repeats forever (eval_input.split={ep.split!r}, '
          f'eval_input.repeat={ep.repeat!r}) and task.train.eval_steps is '
          'None, so evaluation would never end: set --eval_steps=N '
          '(task.train.eval_steps) or eval_input.repeat=False')

  def _CheckInput(self, ds: tf.data.Dataset, name: str) -> None:
    batch_size = self._params.Get(name).batch_size
    replicas = self.topology.num_replicas
    if name == 'input' and replicas > 1:
      if batch_size % replicas:
        raise ValueError(
            f'input.batch_size={batch_size} is not divisible by the '
            f'{replicas} replicas; use a global batch size that is a '
            f'multiple of {replicas}')
      batch_size //= replicas  # what each replica's pipeline splits
    self.task.CheckInputSpec(ds.element_spec, batch_size, name)

  def _TrainingState(self) -> Dict[str, Any]:
    """What a training checkpoint holds (run_checkpoints.RunCheckpoints)."""
    self._BuildOptimizer()
    return dict(model=self.task, optimizer=self.optimizer,
                global_step=self.global_step,
                train_iterator=self._TrainIterator())

  def RestoreLatest(self) -> Optional[str]:
    """Restores the newest intact checkpoint of the logdir; returns its path.

    Damaged checkpoints are skipped with a warning naming the file.

    Raises:
      checkpoints.IncompatibleCheckpointError: the logdir holds a run of
        another model or config (names the variables that differ).
      checkpoints.CheckpointError: checkpoint files exist, none is usable.
    """
    path = self._checkpoints.RestoreTraining()
    if path:
      self._log(f'restored {path} at step {int(self.global_step.numpy())}')
    return path

  def RestoreForEval(self) -> str:
    """Restores the model weights and step only (no lock, no input state).

    Raises:
      checkpoints.NoCheckpointError: the logdir has no checkpoint.
      checkpoints.CheckpointError: as RestoreLatest.
    """
    path = self._checkpoints.RestoreForEval()
    self._log(f'restored {path} at step {int(self.global_step.numpy())}')
    return path

  def SaveCheckpoint(self) -> str:
    """Saves a checkpoint of the current step; returns its path.

    Raises:
      run_checkpoints.CheckpointWriteError: the files could not be written
        (disk full, permissions); earlier checkpoints are intact.
    """
    return self._checkpoints.Save(self.global_step)

  # -- steps ----------------------------------------------------------------

  def _BuildOptimizer(self) -> None:
    # Slots keyed by variable path: a checkpoint restores under any K.
    for task, opt in zip(self._tasks, self._optimizers):
      opt.Build(base_layer.VariablesByPath(task, trainable_only=True))

  def _ReplicaState(self) -> List[List[tf.Variable]]:
    """Per local replica: its weights, statistics, slots, in path order."""
    out = []
    for task, opt in zip(self._tasks, self._optimizers):
      state = list(base_layer.VariablesByPath(task).values())
      for path in opt.Paths():
        state.extend(opt.slots[path][k] for k in sorted(opt.slots[path]))
      out.append(state + [opt.iterations])
    return out

  def SyncReplicas(self, when: str, copy: bool = True) -> None:
    """Checks that every replica holds the same state, bitwise.

    Args:
      when: for the log and the error, e.g. 'after restoring ckpt-40'.
      copy: first copy local replica 0's state to this process's other
        replicas (after a restore, which fills replica 0 only).

    Raises:
      RuntimeError: replicas (in other worker processes) hold other weights.
    """
    if self.topology.num_replicas == 1:
      return
    self._BuildOptimizer()
    state = self._ReplicaState()
    if copy:
      distribute.CopyReplicaZero(state)
    names = list(base_layer.VariablesByPath(self.task))
    opt = self.optimizer
    for path in opt.Paths():
      names.extend(f'optimizer slot {path}/{k}' for k in sorted(opt.slots[path]))
    names.append('optimizer iterations')
    distribute.CheckReplicasEqual(self.topology, state, names, when)
    self._log(f'the {self.topology.num_replicas} replicas hold identical '
              f'weights and optimizer state {when}')

  def _BuildTrainFn(self):
    schedule = self.lr_schedule
    tp = self._params.task.train
    self._BuildOptimizer()
    step_var = self.global_step

    # autograph=False: the step uses TF's control flow; AutoGraph's rewrite
    # cost 3 s of every first step (a layer branching in Python on a tensor
    # now gets TF's "tf.Tensor as a Python bool" error).
    @tf.function(autograph=False)
    def TrainStep(batch, stop):
      step = step_var.read_value()
      # NASNet's drop-path schedule: progress = step / max_steps, so
      # drop-path grows from none at step 0 to full strength at the end.
      progress = tf.minimum(1.0, tf.cast(step, tf.float32) /
                            float(max(1, tp.max_steps)))
      lr = schedule(step)
      # The context reaches every replica thread (distribute.RunReplicas).
      with py_utils.TrainingMode(True), py_utils.StepSeed(step), \
          py_utils.DropPathProgress(progress):
        values = distribute.TrainStep(self.topology, self._tasks,
                                      self._optimizers, batch, lr,
                                      tp.grad_norm_clip or 0.0, stop=stop)
      step_var.assign_add(1)
      values['learning_rate'] = lr
      # After the update: a step that makes a weight or a slot NaN / Inf
      # (an infinite lr, an overflowing second moment) must not be saved.
      values[WEIGHTS_FINITE] = finite_check.AllFinite(
          self._CheckedVariables())
      return values
    return TrainStep

  def _CheckedVariables(self) -> List[tf.Variable]:
    """Float variables of the model and the optimizer (weights, slots)."""
    seen, out = set(), []
    for v in list(self.task.variables) + list(self.optimizer.variables):
      if v.dtype.is_floating and id(v) not in seen:
        seen.add(id(v))
        out.append(v)
    return out

  def TrainStep(self, batch: NestedMap) -> Dict[str, tf.Tensor]:
    """One optimizer step on `batch`; returns metric tensors.

    `WEIGHTS_FINITE` in the result says whether every weight and slot is
    finite after the update.
    """
    values = self._RunStep(batch, stop=False)
    values.pop(distribute.STOP_VOTES)
    return values

  def _RunStep(self, batch: NestedMap, stop: bool) -> Dict[str, tf.Tensor]:
    """TrainStep, also all-reducing this process's stop flag (STOP_VOTES)."""
    if self._train_fn is None:
      self._train_fn = self._BuildTrainFn()
    # A tensor, not a Python bool: one trace for both values.
    return dict(self._train_fn(batch, tf.constant(1.0 if stop else 0.0)))

  def _StopAgreed(self, votes: float) -> bool:
    """Whether to stop after this step: every process decides alike."""
    if self._stop is None:
      return False
    return preemption.StopAgreed(votes, self._stop.requested,
                                 self.topology.num_replicas,
                                 self.topology.num_local_replicas)

  def _NextBatch(self, iterator, inp, name: str, step: int):
    """next(iterator), with the input's one-line diagnosis of read errors."""
    try:
      return next(iterator)
    except StopIteration:
      raise ValueError(
          f'the {name} ran out of batches after step {step}; let it repeat '
          f'({name}.repeat=True or None for a training split) or lower '
          'task.train.max_steps') from None
    except tf.errors.OpError as e:
      raise base_input.DataFileError(inp.DescribeReadError(e)) from None

  def _NonFiniteVariables(self) -> str:
    paths = {id(v): path for path, v in
             base_layer.VariablesByPath(self.task).items()}
    for path, slots in getattr(self.optimizer, 'slots', {}).items():
      for name, v in slots.items():
        paths[id(v)] = f'{path} ({name} slot)'
    return finite_check.NonFiniteNames(self._CheckedVariables(), paths)

  # -- loops ------------------------------------------------------------------

  def Train(self, max_steps: Optional[int] = None,
            eval_fn=None) -> Dict[str, float]:
    """Trains up to `max_steps` (default task.train.max_steps), resuming.

    Args:
      max_steps: total step count to reach.
      eval_fn: called as eval_fn(step) every eval_interval_steps if set.

    Returns:
      The last logged training metrics.

    Raises:
      logdir.LogdirLockedError: another trainer trains in this logdir.
      checkpoints.CheckpointError: the logdir's checkpoints are all damaged,
        or (IncompatibleCheckpointError) belong to another model or config.
      NonFiniteError: the loss or a weight became NaN / Inf (nothing saved).
      run_checkpoints.CheckpointWriteError: a checkpoint could not be
        written.
      preemption.StopRequested: a stop signal; the step reached is saved.
      base_input.DataFileError: the input's files are missing or damaged.
      ValueError: inputs that do not fit the model (see CheckInputs).
    """
    took_lock = self._is_chief and not self._lock.held
    self.Lock()
    try:
      return self._Train(max_steps, eval_fn)
    finally:
      if took_lock:
        self.Unlock()

  def _Train(self, max_steps, eval_fn) -> Dict[str, float]:
    tp = self._params.task.train
    max_steps = tp.max_steps if max_steps is None else max_steps
    self.CheckInputs(train=True, evaluate=eval_fn is not None)
    self._checkpoints.Tidy()
    restored = self.RestoreLatest()
    self.SyncReplicas(f'after restoring {restored}' if restored else
                      'after initialisation')
    start_step = int(self.global_step.numpy())
    if self._is_chief:
      logdir_lib.WriteParams(self._logdir, self._params.ToText(), start_step,
                             self._Warn)
    iterator = self._TrainIterator()
    writer = (tf.summary.create_file_writer(os.path.join(self._logdir,
                                                         'train'))
              if self._is_chief else tf.summary.create_noop_writer())
    batch_size = self._params.input.batch_size
    if start_step >= max_steps:
      self._log(f'step {start_step} >= max_steps {max_steps}: nothing to '
                'train')
      return {}
    self._log(f'training {self._params.name} from step {start_step} to '
              f'{max_steps} (batch size {batch_size}); logdir {self._logdir}')
    if self._is_chief:
      for message in normalization.MovingAverageWarnings(self.task,
                                                         max_steps):
        self._Warn(message)
    last = {}
    t_start = time.perf_counter()
    rate = summaries.StepRate(batch_size)
    first_step_done = False
    step = start_step
    stop_now = False
    while step < max_steps and not stop_now:
      t0 = time.perf_counter()
      batch = self._NextBatch(iterator, self.TrainInput(), 'input', step)
      values = self._RunStep(batch, self._stop is not None and
                             self._stop.requested)
      step += 1
      rate.Tick()
      stop_now = self._StopAgreed(float(values.pop(distribute.STOP_VOTES)))
      finite = {'loss': float(values['loss']),
                WEIGHTS_FINITE: bool(values.pop(WEIGHTS_FINITE))}
      if not first_step_done:
        # The first step includes tracing: keep it out of the speed figures.
        values = _Scalars(values)
        first_step_done = True
        rate.Reset()
        self._log(f'step {step}: loss {values["loss"]:.4f} (first step, '
                  f'{time.perf_counter() - t0:.1f} s with tracing)')
        if self._stop is not None:
          self._stop.Arm()  # from now on a signal stops after a step
      step_time = time.perf_counter() - t0
      finite_check.CheckStep(finite['loss'], finite[WEIGHTS_FINITE], step,
                             self.latest_checkpoint, self._NonFiniteVariables)
      log_now = step % tp.log_interval_steps == 0 or step == max_steps
      summary_now = step % tp.summary_interval_steps == 0
      if log_now or summary_now:
        last = rate.Add(_Scalars(values), step_time)
      if summary_now:
        summaries.WriteScalars(writer, last, step)
      if log_now:
        self._log(summaries.StepLine(step, max_steps, last))
        rate.Reset()
      if (self._is_chief and step % tp.save_interval_steps == 0 and
          step < max_steps and not stop_now):
        path = self.SaveCheckpoint()
        self._log(f'saved {path}')
      if (eval_fn is not None and tp.eval_interval_steps and not stop_now and
          step % tp.eval_interval_steps == 0 and step < max_steps):
        eval_fn(step)
        # One process: a signal during the evaluation stops here.
        stop_now = self._StopAgreed(0.0)
    self.SyncReplicas(f'after step {step}', copy=False)
    done = (f'trained {step - start_step} steps in '
            f'{time.perf_counter() - t_start:.1f} s')
    if self._is_chief:
      done = f'saved {self.SaveCheckpoint()}; {done}'
    self._log(done)
    writer.close()
    if stop_now:
      raise preemption.StopRequested(self._stop.signum, step,
                                     self.latest_checkpoint if self._is_chief
                                     else None)
    return last

  def RecomputeBatchNormStats(self, num_batches: int) -> int:
    """Sets batch-norm moving averages from training batches ("precise BN").

    See precise_bn.RecomputeBatchNormStats: in memory only, one process;
    returns the number of batch-norm layers updated.
    """
    return precise_bn.RecomputeBatchNormStats(
        self.task, self.TrainInput, num_batches, self.topology.num_replicas,
        self._log)

  def _BuildEvalFn(self):
    task = self.task

    @tf.function(autograph=False)  # as TrainStep
    def EvalStep(batch):
      with py_utils.EvalMode():
        out = task.FPropDefaultTheta(batch)
      return dict(out.metrics)
    return EvalStep

  def Evaluate(self, eval_steps: Optional[int] = None,
               restore: bool = True) -> Dict[str, float]:
    """Evaluates on the eval input; writes summaries and eval_metrics.json.

    Args:
      eval_steps: batches to read (>= 1); None uses task.train.eval_steps,
        and when that is None the whole split (which must not repeat).
      restore: restore the model from the newest intact checkpoint first
        (eval mode); False evaluates the weights as they are (after Train).

    Returns:
      Weighted means of the task's metrics over the eval examples (a split
      read once is covered completely: its last batch is padded, and the
      padding left out, see base_input.py), plus derived ones (perplexity,
      bleu), num_batches and num_examples.

    Raises:
      checkpoints.NoCheckpointError: restore=True and no checkpoint exists.
      ValueError: eval_steps < 1, or a repeating eval input without
        eval_steps.
      base_input.DataFileError: the eval input's files are damaged.
    """
    if eval_steps is not None and (not isinstance(eval_steps, int) or
                                   isinstance(eval_steps, bool) or
                                   eval_steps < 1):
      raise ValueError(f'eval_steps={eval_steps!r} must be an int >= 1, or '
                       'None for task.train.eval_steps')
    if eval_steps is None:
      eval_steps = self._params.task.train.eval_steps
    eval_input = self.EvalInput()
    dataset = eval_input.Dataset()
    self._CheckInput(dataset, 'eval_input')
    self._CheckEvalEnds(dataset, eval_steps)
    if restore:
      self.RestoreForEval()
    if self._eval_fn is None:
      self._eval_fn = self._BuildEvalFn()
    t0 = time.perf_counter()
    metrics = evaluation.Evaluate(
        self.task, self._eval_fn, eval_input, dataset, eval_steps,
        self._params.eval_input.batch_size, self._stop, self._log)
    if not metrics:
      return metrics  # stopped by a signal: nothing written
    step = int(self.global_step.numpy())
    if self._is_chief:  # other workers evaluate the same weights
      summaries.WriteEvalResults(self._logdir, metrics, step, self._Warn)
    shown = ', '.join(f'{k} {v:.4f}' for k, v in sorted(metrics.items()))
    self._log(f'eval at step {step} ({int(metrics["num_batches"])} batches, '
              f'{time.perf_counter() - t0:.1f} s): {shown}')
    return metrics

