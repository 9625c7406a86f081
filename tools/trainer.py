"""Trains and evaluates a registered experiment.

  bazel run //tools:trainer -- --model=image.fashion_mnist.ResNet4x8 \
      --logdir=/tmp/fmnist
  python -m tools.trainer --model=consistency.Consistency16 --logdir=/tmp/c \
      --model_params_override='task.train.max_steps=20; input.batch_size=32'

Writes logdir/params.txt (the final Params), TensorBoard summaries in
logdir/train and logdir/eval, checkpoints in logdir/checkpoints (resumed on
restart) and logdir/eval_metrics.json. Without an accelerator the pipeline's
partitions run on --num_cpu_devices logical CPU devices (default: the largest
num_partitions of the experiment's model).
"""

import sys

from absl import app
from absl import flags
from absl import logging

from tools import paths

FLAGS = flags.FLAGS
flags.DEFINE_string('model', None, 'Registered experiment key, e.g. '
                    'image.fashion_mnist.ResNet4x8 (--model=list lists them).')
flags.DEFINE_string('logdir', None, 'Directory of checkpoints, summaries and '
                    'params.txt; relative paths are taken from the directory '
                    'bazel run was called in.')
flags.DEFINE_enum('mode', 'train_and_eval', ['train', 'eval', 'train_and_eval'],
                  'What to run.')
flags.DEFINE_string('model_params_override', '', "Params overrides, 'key=value' "
                    "or 'key : value' items separated by ';' or newlines, e.g. "
                    "'task.model.num_micro_batches=16; input.batch_size=64'.")
flags.DEFINE_integer('max_steps', None, 'Overrides task.train.max_steps.')
flags.DEFINE_integer('eval_steps', None, 'Eval batches (overrides '
                     'task.train.eval_steps; default the whole eval split).')
flags.DEFINE_integer('num_cpu_devices', None, 'Logical CPU devices to create '
                     'when there is no accelerator; default: enough for the '
                     "model's partitions.")
flags.DEFINE_integer('seed', 1234, 'Global TensorFlow / NumPy seed.')
flags.DEFINE_bool('deterministic', True, 'Enable op determinism (exact '
                  'resume and reproducible runs on CPU).')


class _UserError(Exception):
  """A mistake in the flags, overrides or setup: printed without traceback."""


def _NumPartitions(p) -> int:
  """Largest num_partitions / len(partitions) of any pipeline in the Params."""
  best = 1
  for key, value in p.IterParams():
    if hasattr(value, 'IterParams'):
      best = max(best, _NumPartitions(value))
    if key == 'num_partitions' and isinstance(value, int):
      best = max(best, value)
    if key == 'partitions' and isinstance(value, (list, tuple)):
      best = max(best, len(value))
  return best


def _Setup():
  """Flags -> (trainer, mode); raises _UserError for user mistakes."""
  # Nothing here may run a TensorFlow op before the devices are configured.
  from tensorpipe import model_registry  # pylint: disable=g-import-not-at-top
  from tensorpipe import trainer_lib  # pylint: disable=g-import-not-at-top
  import tensorpipe  # pylint: disable=g-import-not-at-top
  if not FLAGS.model:
    raise _UserError('--model is required, e.g. --model='
                     'image.fashion_mnist.ResNet4x8; --model=list lists the '
                     'registered experiments')
  if FLAGS.model == 'list':
    print('\n'.join(model_registry.ListKeys()))
    sys.exit(0)
  if not FLAGS.logdir:
    raise _UserError('--logdir is required (where checkpoints, summaries and '
                     'params.txt go)')
  try:
    exp = model_registry.GetExperiment(FLAGS.model)
    p = exp.ModelParams()
    trainer_lib.ApplyOverrides(p, FLAGS.model_params_override)
    if FLAGS.max_steps is not None:
      p.task.train.max_steps = FLAGS.max_steps
    if FLAGS.eval_steps is not None:
      p.task.train.eval_steps = FLAGS.eval_steps
  except ValueError as e:
    raise _UserError(str(e)) from None
  num_devices = FLAGS.num_cpu_devices or _NumPartitions(p.task)
  if num_devices < 1:
    raise _UserError(f'--num_cpu_devices={num_devices} must be >= 1')
  tensorpipe.SetNumLogicalCpuDevices(num_devices)
  if FLAGS.deterministic:
    trainer_lib.EnableDeterminism(FLAGS.seed)
  logdir = paths.UserPath(FLAGS.logdir)
  try:
    trainer = trainer_lib.Trainer(p, logdir, log_fn=logging.info)
    # Builds the inputs now, so a missing data set fails before training.
    if FLAGS.mode != 'eval':
      trainer.TrainInput().Dataset()
    if FLAGS.mode != 'train':
      trainer.EvalInput().Dataset()
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise _UserError(f'{type(e).__name__}: {e}') from None
  return trainer


def _Main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  try:
    trainer = _Setup()
  except _UserError as e:
    print(f'trainer: error: {e}', file=sys.stderr)
    return 2
  mode = FLAGS.mode
  if mode in ('train', 'train_and_eval'):
    eval_fn = (lambda step: trainer.Evaluate(restore=False)) if (
        mode == 'train_and_eval') else None
    trainer.Train(eval_fn=eval_fn)
  if mode in ('eval', 'train_and_eval'):
    metrics = trainer.Evaluate(restore=True)
    print('final eval: ' + ', '.join(f'{k}={v:.4f}'
                                     for k, v in sorted(metrics.items())))
  return 0


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
