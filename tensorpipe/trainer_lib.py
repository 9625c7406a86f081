"""Training and evaluation loops: checkpoints, summaries, resume, metrics.

`Trainer(params, logdir)` builds the task, inputs and optimizer from an
experiment's Params (`BaseExperiment.ModelParams()`, overrides applied) and
runs:

  restore the latest checkpoint in logdir (model, optimizer, step, the
    input iterator's position) if there is one
  while step < max_steps:
    batch = next(train iterator)
    with StepSeed(step), DropPathProgress(step / max_steps):
      loss, grads = task.ComputeLoss(batch), gradients
    clip grads by global norm; optimizer.Apply(lr_schedule(step), grads)
    log / write summaries / save a checkpoint at their intervals
  save a checkpoint; evaluate on the eval input

Randomness inside the model (dropout) depends only on the layer seeds and the
step, and the input position is in the checkpoint, so with
`EnableDeterminism()` a run killed and restarted ends with exactly the weights
of an uninterrupted run.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from tensorflow.core.framework import summary_pb2

from tensorpipe import base_layer
from tensorpipe import decode_metrics
from tensorpipe import hyperparams
from tensorpipe import py_utils
from tensorpipe.nested_map import NestedMap

PARAMS_FILE = 'params.txt'
EVAL_FILE = 'eval_metrics.json'


def EnableDeterminism(seed: int) -> None:
  """Deterministic ops and fixed global seeds (call before building)."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  tf.config.experimental.enable_op_determinism()


def _SplitOverrideItems(text: str) -> List[str]:
  """Splits on newlines, and on ';' outside quoted strings.

  A quote opened on a line ends there at the latest (values are one line),
  so an unterminated string cannot swallow the next line's items; FromText
  then reports it.
  """
  items, current, quote, i = [], [], None, 0
  while i < len(text):
    ch = text[i]
    if ch == '\n' or (ch == ';' and quote is None):
      items.append(''.join(current))
      current, quote = [], None
    else:
      current.append(ch)
      if quote is not None and ch == '\\' and i + 1 < len(text):
        current.append(text[i + 1])  # an escaped character, e.g. \'
        i += 1
      elif quote is None and ch in '\'"':
        quote = ch
      elif ch == quote:
        quote = None
    i += 1
  items.append(''.join(current))
  return items


def ParseOverrides(text: str) -> str:
  """Turns override text into FromText lines ('key : value').

  Accepts `key=value` or `key : value` items, separated by ';' or newlines;
  a ';' inside a quoted value ("task.name='a;b'") is part of the value.
  Blank items and '#' comments are skipped.

  Raises:
    ValueError: an item without '=' or ':'.
  """
  lines = []
  for item in _SplitOverrideItems(text or ''):
    item = item.strip()
    if not item or item.startswith('#'):
      continue
    eq, colon = item.find('='), item.find(':')
    positions = [i for i in (eq, colon) if i > 0]
    if not positions:
      raise ValueError(f'override {item!r} is not of the form key=value or '
                       "'key : value', e.g. task.train.max_steps=100")
    i = min(positions)
    key, value = item[:i].strip(), item[i + 1:].strip()
    if not value:
      raise ValueError(f'override {item!r} has no value after the '
                       f'{item[i]!r}')
    lines.append(f'{key} : {value}')
  return '\n'.join(lines)


def ApplyOverrides(p: hyperparams.Params, text: str) -> hyperparams.Params:
  """Applies --model_params_override text to `p` in place; returns p.

  Raises:
    ValueError: bad syntax, unknown key (with a did-you-mean) or bad value.
  """
  lines = ParseOverrides(text)
  if not lines:
    return p
  try:
    p.FromText(lines)
  except hyperparams.UnknownParamError as e:
    raise ValueError(f'--model_params_override: {e}') from None
  except (ValueError, TypeError) as e:
    hint = ''
    if 'cannot parse' in str(e):
      hint = (" (values are Python literals: quote strings, e.g. "
              "key='text'; numbers, True/False, None and lists as in Python)")
    raise ValueError(f'--model_params_override: {e}{hint}') from None
  return p


def WriteScalar(name: str, value: float, step: int) -> None:
  """Writes a TensorBoard scalar to the default writer.

  Same record as tensorboard's `tf.summary.scalar` (plugin 'scalars'), without
  needing the tensorboard package installed.
  """
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = 'scalars'
  tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                   metadata=metadata)


def _Scalars(metrics: Dict[str, Any]) -> Dict[str, float]:
  return {k: float(v) for k, v in metrics.items()}


class Trainer:
  """Trains and evaluates one experiment in one logdir.

  Usage:
    p = model_registry.GetExperiment(key).ModelParams()
    trainer = Trainer(p, logdir)
    trainer.Train()          # resumes from logdir if it has checkpoints
    metrics = trainer.Evaluate()
  """

  def __init__(self, params: hyperparams.Params, logdir: str,
               log_fn=None):
    self._params = params.Copy()
    self._logdir = logdir
    self._log = log_fn or logging.info
    p = self._params
    tp = p.task.train
    if not isinstance(tp.max_steps, int) or tp.max_steps < 0:
      raise ValueError(f'task.train.max_steps={tp.max_steps!r} must be an '
                       'int >= 0')
    for name in ('save_interval_steps', 'summary_interval_steps',
                 'log_interval_steps'):
      value = getattr(tp, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'task.train.{name}={value!r} must be an int >= 1')
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, PARAMS_FILE), 'w') as f:
      f.write(p.ToText())

    self.task = p.task.Instantiate()
    self.optimizer = tp.optimizer.Instantiate()
    self.lr_schedule = tp.lr_schedule.Instantiate()
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name='global_step')
    self._train_input = None
    self._train_iter = None
    self._eval_input = None
    self._train_fn = None
    self._eval_fn = None
    self._ckpt = None
    self._manager = None

  @property
  def params(self) -> hyperparams.Params:
    return self._params

  @property
  def logdir(self) -> str:
    return self._logdir

  # -- inputs and checkpoints --------------------------------------------

  def TrainInput(self):
    if self._train_input is None:
      self._train_input = self._params.input.Instantiate()
    return self._train_input

  def EvalInput(self):
    if self._eval_input is None:
      self._eval_input = self._params.eval_input.Instantiate()
    return self._eval_input

  def _TrainIterator(self):
    if self._train_iter is None:
      self._train_iter = iter(self.TrainInput().Dataset())
    return self._train_iter

  def _Checkpoint(self) -> tf.train.CheckpointManager:
    if self._manager is None:
      self._BuildOptimizer()
      self._ckpt = tf.train.Checkpoint(
          model=self.task, optimizer=self.optimizer,
          global_step=self.global_step, train_iterator=self._TrainIterator())
      self._manager = tf.train.CheckpointManager(
          self._ckpt, os.path.join(self._logdir, 'checkpoints'),
          max_to_keep=self._params.task.train.max_checkpoints_to_keep,
          step_counter=self.global_step)
    return self._manager

  def RestoreLatest(self) -> Optional[str]:
    """Restores the newest checkpoint of the logdir; returns its path."""
    manager = self._Checkpoint()
    path = manager.latest_checkpoint
    if path:
      self._ckpt.restore(path).assert_existing_objects_matched()
      self._log(f'restored {path} at step {int(self.global_step.numpy())}')
    return path

  def SaveCheckpoint(self) -> str:
    return self._Checkpoint().save(checkpoint_number=self.global_step)

  # -- steps ----------------------------------------------------------------

  def _BuildOptimizer(self) -> None:
    # Slots keyed by variable path: a checkpoint restores under any K.
    self.optimizer.Build(
        base_layer.VariablesByPath(self.task, trainable_only=True))

  def _BuildTrainFn(self):
    task, opt, schedule = self.task, self.optimizer, self.lr_schedule
    tp = self._params.task.train
    variables = task.trainable_variables
    self._BuildOptimizer()
    step_var = self.global_step

    @tf.function
    def TrainStep(batch):
      step = step_var.read_value()
      # NASNet's drop-path schedule: progress = step / max_steps, so
      # drop-path grows from none at step 0 to full strength at the end.
      progress = tf.minimum(1.0, tf.cast(step, tf.float32) /
                            float(max(1, tp.max_steps)))
      with py_utils.TrainingMode(True), py_utils.StepSeed(step), \
          py_utils.DropPathProgress(progress):
        with tf.GradientTape() as tape:
          out = task.ComputeLoss(batch)
      grads = tape.gradient(out.loss, variables)
      missing = [v.name for g, v in zip(grads, variables) if g is None]
      if missing:
        raise ValueError(f'no gradient for {missing}: these weights do not '
                         'affect the loss')
      grad_norm = tf.linalg.global_norm(grads)
      if tp.grad_norm_clip:
        grads, _ = tf.clip_by_global_norm(grads, tp.grad_norm_clip,
                                          use_norm=grad_norm)
      lr = schedule(step)
      opt.Apply(lr, grads, variables)
      step_var.assign_add(1)
      values = {k: v[0] for k, v in out.metrics.items()}
      values['learning_rate'] = lr
      values['grad_norm'] = grad_norm
      return values
    return TrainStep

  def TrainStep(self, batch: NestedMap) -> Dict[str, tf.Tensor]:
    """One optimizer step on `batch`; returns metric tensors."""
    if self._train_fn is None:
      self._train_fn = self._BuildTrainFn()
    return self._train_fn(batch)

  # -- loops ------------------------------------------------------------------

  def Train(self, max_steps: Optional[int] = None,
            eval_fn=None) -> Dict[str, float]:
    """Trains up to `max_steps` (default task.train.max_steps), resuming.

    Args:
      max_steps: total step count to reach.
      eval_fn: called as eval_fn(step) every eval_interval_steps if set.

    Returns:
      The last logged training metrics.
    """
    tp = self._params.task.train
    max_steps = tp.max_steps if max_steps is None else max_steps
    self.RestoreLatest()
    iterator = self._TrainIterator()
    writer = tf.summary.create_file_writer(os.path.join(self._logdir,
                                                        'train'))
    batch_size = self._params.input.batch_size
    start_step = int(self.global_step.numpy())
    if start_step >= max_steps:
      self._log(f'step {start_step} >= max_steps {max_steps}: nothing to '
                'train')
      return {}
    self._log(f'training {self._params.name} from step {start_step} to '
              f'{max_steps} (batch size {batch_size}); logdir {self._logdir}')
    last = {}
    t_start = time.perf_counter()
    t_window, steps_window = t_start, 0
    first_step_done = False
    step = start_step
    while step < max_steps:
      t0 = time.perf_counter()
      batch = next(iterator)
      values = self.TrainStep(batch)
      step += 1
      steps_window += 1
      if not first_step_done:
        # The first step includes tracing: keep it out of the speed figures.
        values = _Scalars(values)
        first_step_done = True
        t_window, steps_window = time.perf_counter(), 0
        self._log(f'step {step}: loss {values["loss"]:.4f} (first step, '
                  f'{time.perf_counter() - t0:.1f} s with tracing)')
      step_time = time.perf_counter() - t0
      if not np.isfinite(float(values['loss'])):
        raise FloatingPointError(f'loss is {float(values["loss"])} at step '
                                 f'{step}; lower the learning rate or clip '
                                 'gradients (task.train.grad_norm_clip)')
      log_now = step % tp.log_interval_steps == 0 or step == max_steps
      summary_now = step % tp.summary_interval_steps == 0
      if log_now or summary_now:
        last = _Scalars(values)
        elapsed = time.perf_counter() - t_window
        rate = steps_window / elapsed if elapsed > 0 and steps_window else 0.
        examples_per_sec = rate * batch_size
        last['examples_per_sec'] = examples_per_sec
        last['step_time'] = 1.0 / rate if rate else step_time
      if summary_now:
        with writer.as_default():
          for name, value in last.items():
            WriteScalar(name, value, step)
        writer.flush()
      if log_now:
        rate = 1.0 / last['step_time'] if last['step_time'] else 0.0
        eta = (max_steps - step) / rate if rate else float('nan')
        extra = ''
        if 'accuracy' in last:
          extra = f' acc {last["accuracy"]:.4f}'
        elif 'log_pplx' in last:
          extra = f' log_pplx {last["log_pplx"]:.4f}'
        self._log(f'step {step}/{max_steps}: loss {last["loss"]:.4f}{extra} '
                  f'lr {last["learning_rate"]:.3g} grad_norm '
                  f'{last["grad_norm"]:.3g} | {last["examples_per_sec"]:.1f} '
                  f'examples/s, {last["step_time"] * 1e3:.0f} ms/step, ETA '
                  f'{_FormatSeconds(eta)}')
        t_window, steps_window = time.perf_counter(), 0
      if step % tp.save_interval_steps == 0 and step < max_steps:
        path = self.SaveCheckpoint()
        self._log(f'saved {path}')
      if (eval_fn is not None and tp.eval_interval_steps and
          step % tp.eval_interval_steps == 0 and step < max_steps):
        eval_fn(step)
    path = self.SaveCheckpoint()
    self._log(f'saved {path}; trained {step - start_step} steps in '
              f'{time.perf_counter() - t_start:.1f} s')
    writer.close()
    return last

  def _BuildEvalFn(self):
    task = self.task

    @tf.function
    def EvalStep(batch):
      with py_utils.EvalMode():
        out = task.FPropDefaultTheta(batch)
      return {k: v for k, v in out.metrics.items()}
    return EvalStep

  def Evaluate(self, eval_steps: Optional[int] = None,
               restore: bool = True) -> Dict[str, float]:
    """Evaluates on the eval input; writes summaries and eval_metrics.json.

    Args:
      eval_steps: batches to read; None uses task.train.eval_steps, and when
        that is None the whole split.
      restore: restore the latest checkpoint first (eval mode).

    Returns:
      Weighted means of the task's metrics over the eval batches, plus
      derived ones (perplexity, bleu).
    """
    if restore:
      self.RestoreLatest()
    if eval_steps is None:
      eval_steps = self._params.task.train.eval_steps
    if self._eval_fn is None:
      self._eval_fn = self._BuildEvalFn()
    eval_input = self.EvalInput()
    per_batch = []
    # Decoding metrics (e.g. BLEU) are the task's: the trainer only feeds
    # them the eval batches.
    decoded = self.task.CreateDecodeMetrics(eval_input)
    t0 = time.perf_counter()
    for i, batch in enumerate(eval_input.Dataset()):
      if eval_steps is not None and i >= eval_steps:
        break
      per_batch.append({k: (float(v[0]), float(v[1]))
                        for k, v in self._eval_fn(batch).items()})
      if decoded is not None:
        decoded.Update(batch)
    if not per_batch:
      raise ValueError('the eval input gave no batch: its split has fewer '
                       f'examples than batch_size='
                       f'{self._params.eval_input.batch_size}')
    metrics = self.task.AggregateMetrics(
        [{k: v for k, v in m.items()} for m in per_batch])
    metrics = self.task.PostProcessEvalMetrics(metrics)
    if decoded is not None:
      metrics.update(decoded.Finalize())
    metrics['num_batches'] = float(len(per_batch))
    step = int(self.global_step.numpy())
    writer = tf.summary.create_file_writer(os.path.join(self._logdir, 'eval'))
    with writer.as_default():
      for name, value in metrics.items():
        WriteScalar(name, value, step)
    writer.close()
    with open(os.path.join(self._logdir, EVAL_FILE), 'w') as f:
      json.dump(dict(metrics, step=step), f, indent=1, sort_keys=True)
    shown = ', '.join(f'{k} {v:.4f}' for k, v in sorted(metrics.items()))
    self._log(f'eval at step {step} ({len(per_batch)} batches, '
              f'{time.perf_counter() - t0:.1f} s): {shown}')
    return metrics


# Public since the first release; the decoding metrics own it now.
ComputeBleu = decode_metrics.ComputeBleu


def _FormatSeconds(seconds: float) -> str:
  if not np.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'
