"""Exports a trained run as a SavedModel for serving (tensorpipe/export.py).

  python -m tools.export --model=image.fashion_mnist.ResNet4x8 \
      --logdir=logs/fashion_mnist --export_dir=exports/fashion_mnist
  bazel run //tools:export -- --model=... --logdir=... --export_dir=...

Rebuilds the model from the run's logdir/params.txt (so the run's
--model_params_override values are honoured), restores its newest intact
checkpoint and writes a SavedModel whose `serving_default` signature runs it
in inference mode (batch norm on its moving averages, no dropout): inputs
named after the batch key the task reads (`image` for the image
experiments: float32 [batch, height, width, channels], preprocessed as the
experiment's eval input gives it), outputs `logits` and `probabilities`. Any
batch size works. Load it anywhere with TensorFlow alone:

  serve = tf.saved_model.load(export_dir).signatures['serving_default']
  serve(image=images)['probabilities']

Image experiments get a second signature, `serving_raw` (--raw_images,
default on): it takes the raw uint8 images [batch, height, width, channels]
and applies the experiment's eval preprocessing (scaling, normalisation) in
the graph, so a client cannot send unnormalised pixels by mistake; a request
of another rank or shape gets an InvalidArgumentError naming the expected
shape. `serving_default` stays the float32 signature of the preprocessed
images, for existing clients:

  raw = tf.saved_model.load(export_dir).signatures['serving_raw']
  raw(image=uint8_images)['probabilities']

--devices: where the SavedModel runs.
  (unset) or 1     the layers chained on one device (first GPU, else CPU:0)
  /GPU:1           the same on that device
  4                pipelined over 4 devices (GPUs, else 4 logical CPU
                   devices), T micro-batches per chunk of
                   --serving_batch_size rows (default: the run's batch size);
                   a request is padded to whole chunks and sliced back
  /GPU:0,/GPU:1    pipelined over these devices
A loader without those devices places the ops on the ones it has.

--model_params_override changes the run's Params after params.txt, as the
trainer's flag does. A run trained with a CSV schedule file before the
trainer recorded the table in params.txt (schedules.CsvParam) names only
the file; where it is gone, name a copy:

  python -m tools.export ... \
      --model_params_override="task.model.schedule='/copy/of/z.csv'"

Mistakes end in one line `export: error: ...` on stderr naming the value and
the fix (exit code 2): a logdir without params.txt or checkpoint, --model
not the run's experiment, a checkpoint of another model, an export_dir that
is not empty (pass --overwrite to replace it), a schedule file that cannot
be read.
"""

# First, before anything imports TensorFlow: its C++ log lines off (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order

import sys

from absl import app
from absl import flags
from absl import logging

from tools import paths

FLAGS = flags.FLAGS
flags.DEFINE_string('model', None, 'Registered experiment key of the run, e.g. '
                    'image.fashion_mnist.ResNet4x8.')
flags.DEFINE_string('logdir', None, "The trainer's logdir (params.txt and "
                    'checkpoints/); relative paths are taken from the '
                    'directory bazel run was called in.')
flags.DEFINE_string('export_dir', None, 'Folder to write the SavedModel to; '
                    'must be new or empty unless --overwrite.')
flags.DEFINE_string('devices', None, 'Unset or 1: one device (first GPU, '
                    'else /CPU:0); a device name: that one device; an int K '
                    '>= 2: pipelined over K default devices; a comma-separated '
                    'list of K names: pipelined over them.')
flags.DEFINE_integer('serving_batch_size', None, 'Pipelined serving: rows per '
                     'pipeline call (a multiple of the micro-batch count); '
                     "default: the run's input.batch_size.")
flags.DEFINE_string('model_params_override', '', "Params overrides applied "
                    "after the run's params.txt, as the trainer's flag takes "
                    "them, e.g. \"task.model.schedule='/copy/of/z.csv'\" for "
                    'a run trained with a CSV schedule file that is not here '
                    '(runs trained now record the table in params.txt).')
flags.DEFINE_bool('overwrite', False, 'Replace what --export_dir holds.')
flags.DEFINE_bool('raw_images', True, "Image experiments: also write the "
                  "'serving_raw' signature, which takes uint8 images [batch, "
                  'height, width, channels] and applies the eval '
                  'preprocessing in the graph.')


class _UserError(Exception):
  """A mistake in the flags or the logdir: printed without traceback."""


class _Placement:
  """--devices parsed: pipelined or not, device names, partition count."""

  def __init__(self, text):
    self.pipelined = False
    self.devices = None
    self.num_partitions = None
    text = (text or '').strip()
    if not text or text == '1':
      return
    if text.isdigit():
      k = int(text)
      if k < 1:
        raise _UserError(f'--devices={text}: give 1 (one device) or K >= 2 '
                         '(pipelined over K devices)')
      self.pipelined, self.num_partitions = True, k
      return
    names = [d.strip() for d in text.split(',')]
    if any(not d.startswith('/') for d in names):
      raise _UserError(f'--devices={text!r} is neither a count nor a list of '
                       'device names; use e.g. --devices=4 or '
                       '--devices=/GPU:0,/GPU:1')
    self.devices = names
    if len(names) > 1:
      self.pipelined, self.num_partitions = True, len(names)


def _Main(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  try:
    _Export()
  except _UserError as e:
    print(f'export: error: {e}', file=sys.stderr)
    return 2
  return 0


def _OneLine(e: BaseException) -> str:
  from tensorpipe import errors  # pylint: disable=g-import-not-at-top
  return f'{type(e).__name__}: {errors.FirstLine(e, limit=2000)}'


def _Export() -> None:
  """Flags -> export_run.ExportRun; raises _UserError for mistakes."""
  # Nothing here may run a TensorFlow op before the devices are configured.
  # pylint: disable=g-import-not-at-top
  from tensorpipe import checkpoints
  from tensorpipe import devices as devices_lib
  from tensorpipe import export
  from tensorpipe import export_run
  from tensorpipe import hyperparams
  from tensorpipe import model_registry
  # pylint: enable=g-import-not-at-top
  for name in ('model', 'logdir', 'export_dir'):
    if not getattr(FLAGS, name):
      raise _UserError(f'--{name} is required, e.g. --model=image.'
                       'fashion_mnist.ResNet4x8 --logdir=logs/fashion_mnist '
                       '--export_dir=exports/fashion_mnist')
  placement = _Placement(FLAGS.devices)
  if placement.pipelined is False and FLAGS.serving_batch_size is not None:
    raise _UserError('--serving_batch_size is for pipelined serving '
                     '(--devices=K with K >= 2); on one device any batch '
                     'size is served as it is')
  logdir = paths.UserPath(FLAGS.logdir)
  export_dir = paths.UserPath(FLAGS.export_dir)
  setup_errors = (ValueError, TypeError, OSError, RuntimeError,
                  hyperparams.UnknownParamError, checkpoints.CheckpointError)
  try:
    # Pure Python: the export folder, the experiment and params.txt are
    # checked before TensorFlow starts.
    export.CheckExportDir(export_dir, FLAGS.overwrite)
    experiment = model_registry.GetExperiment(FLAGS.model).ModelParams()
    export_run.RunParams(experiment, logdir, FLAGS.model,
                         FLAGS.model_params_override)
    devices_lib.SetNumLogicalCpuDevices(
        placement.num_partitions if placement.pipelined else 1)
    export_run.ExportRun(experiment, FLAGS.model, logdir, export_dir,
                         pipelined=placement.pipelined,
                         devices=placement.devices,
                         num_partitions=placement.num_partitions,
                         serving_batch_size=FLAGS.serving_batch_size,
                         overwrite=FLAGS.overwrite, log_fn=logging.info,
                         raw_images=FLAGS.raw_images,
                         params_override=FLAGS.model_params_override)
  except setup_errors as e:
    raise _UserError(_OneLine(e)) from None


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
