"""A task's training settings, `p.train`: their Params and their checks.

Lingvo's `p.train`: the optimizer and learning-rate schedule Params,
gradient clipping, L2 weight, steps and intervals. `tasks.BaseTask` holds
them as `p.train`; the trainer (trainer_lib) checks them with
`CheckTrainParams` before it builds anything and reads them.

Usage:
  tp = TrainParams()
  tp.optimizer = optimizers.RMSProp.Params()
  CheckTrainParams(tp)  # one-line ValueError for a value it cannot use
"""

import numpy as np

from tensorpipe import hyperparams
from tensorpipe import lr_schedules
from tensorpipe import optimizers


def TrainParams() -> hyperparams.Params:
  """The `p.train` settings of a task (Lingvo's `p.train`)."""
  p = hyperparams.Params()
  p.Define('optimizer', optimizers.SGD.Params(), 'Optimizer Params '
           '(tensorpipe.optimizers).')
  p.Define('lr_schedule', lr_schedules.Constant.Params(), 'Learning-rate '
           'schedule Params (tensorpipe.lr_schedules), a function of the '
           'global step.')
  p.Define('grad_norm_clip', None, 'If > 0, gradients are scaled so their '
           'global norm is at most this; None or 0 (as in Lingvo) means no '
           'clipping; negative values are rejected.')
  p.Define('l2_regularizer_weight', 0.0, 'Weight decay: adds weight * '
           'sum(w^2) / 2 over the regularised weights to the loss.')
  p.Define('l2_regularize_all', False, 'If True the L2 term covers all '
           'trainable weights; else only those of rank >= 2 (kernels, not '
           'biases or normalisation scales).')
  p.Define('max_steps', 1000, 'Optimizer steps to train for (one per '
           'mini-batch).')
  p.Define('save_interval_steps', 500, 'Steps between checkpoints (one is '
           'also written at the end).')
  p.Define('max_checkpoints_to_keep', 3, 'Checkpoints kept in the logdir '
           '(>= 1; None keeps all).')
  p.Define('summary_interval_steps', 50, 'Steps between TensorBoard '
           'training summaries.')
  p.Define('log_interval_steps', 50, 'Steps between progress log lines.')
  p.Define('eval_interval_steps', 0, 'In train_and_eval mode, steps between '
           'evaluations (0 = evaluate only at the end).')
  p.Define('eval_steps', None, 'Eval batches per evaluation (>= 1); None '
           'reads the whole eval split, which must then not repeat.')
  return p


def CheckTrainParams(tp: hyperparams.Params) -> None:
  """One-line ValueErrors for task.train values the training loop cannot use."""
  if (not isinstance(tp.max_steps, int) or isinstance(tp.max_steps, bool) or
      tp.max_steps < 0):
    raise ValueError(f'task.train.max_steps={tp.max_steps!r} must be an '
                     'int >= 0')
  for name in ('save_interval_steps', 'summary_interval_steps',
               'log_interval_steps'):
    value = getattr(tp, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f'task.train.{name}={value!r} must be an int >= 1')
  keep = tp.max_checkpoints_to_keep
  if keep is not None and (not isinstance(keep, int) or
                           isinstance(keep, bool) or keep < 1):
    raise ValueError(f'task.train.max_checkpoints_to_keep={keep!r} must be '
                     'an int >= 1 (or None to keep every checkpoint)')
  if tp.eval_steps is not None and (
      not isinstance(tp.eval_steps, int) or isinstance(tp.eval_steps, bool)
      or tp.eval_steps < 1):
    raise ValueError(f'task.train.eval_steps={tp.eval_steps!r} (or '
                     '--eval_steps) must be an int >= 1, or None to read the '
                     'whole eval split')
  clip = tp.grad_norm_clip
  if clip is not None and (not isinstance(clip, (int, float)) or
                           isinstance(clip, bool) or not np.isfinite(clip) or
                           clip < 0):
    raise ValueError(f'task.train.grad_norm_clip={clip!r} must be a finite '
                     'number > 0 (the largest global gradient norm), or 0 / '
                     'None for no clipping')
  if (not isinstance(tp.eval_interval_steps, int) or
      isinstance(tp.eval_interval_steps, bool) or tp.eval_interval_steps < 0):
    raise ValueError(f'task.train.eval_interval_steps='
                     f'{tp.eval_interval_steps!r} must be an int >= 0 (0: '
                     'evaluate only at the end)')
