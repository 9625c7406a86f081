"""Trains the Keras CNN of image.fashion_mnist.KerasCnn4x8 with model.fit.

The same model as the trainer's experiment (models/keras_models.py), wrapped
in keras_pipeline.TensorPipeModel (K partitions, T micro-batches) and
trained by the normal Keras loop on Fashion-MNIST, with Keras' TensorBoard
and ModelCheckpoint callbacks; then evaluated on the test split and,
with --export_dir, exported as a SavedModel.

  python -m tools.keras_fit --logdir=/tmp/keras_fit --epochs=1
  bazel run //tools:keras_fit -- --logdir=/tmp/keras_fit --steps_per_epoch=50

Writes logdir/train and logdir/validation (TensorBoard), logdir/model.keras
(the model after each epoch: keras.models.load_model reads it back) and
prints one line of test metrics. Without an accelerator the partitions run
on K logical CPU devices.

Mistakes end in one line `keras_fit: error: ...` on stderr naming the value
and the fix, without a traceback (as tools/trainer.py). Exit codes: 0 done;
2 the command cannot run as given (flags, a data set that is not prepared);
1 the run failed on the way (damaged input data, a NaN / Inf).
"""

# First, before anything imports TensorFlow: its C++ log lines off (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order

import os
import sys

from absl import app
from absl import flags

from tools import paths

FLAGS = flags.FLAGS
flags.DEFINE_string('logdir', None, 'Directory of TensorBoard summaries and '
                    'model.keras; relative paths are taken from the '
                    'directory the command was run in.')
flags.DEFINE_integer('epochs', 1, 'Epochs of model.fit.')
flags.DEFINE_integer('steps_per_epoch', None, 'Steps per epoch; default one '
                     'pass over the 60000 training images.')
flags.DEFINE_integer('eval_steps', None, 'Test batches to evaluate; default '
                     'the whole test split.')
flags.DEFINE_integer('batch_size', 128, 'Mini-batch N (a multiple of T).')
flags.DEFINE_integer('num_partitions', 4, 'K.')
flags.DEFINE_integer('num_micro_batches', 8, 'T.')
flags.DEFINE_float('learning_rate', 0.05, 'SGD learning rate (Nesterov '
                   'momentum 0.9).')
flags.DEFINE_string('data_dir', None, 'Prepared TFDS data (default: data/tfds '
                    'or $TENSORPIPE_DATA_DIR).')
flags.DEFINE_string('export_dir', None, 'If set, a SavedModel of the trained '
                    'model (serving_default: inputs -> outputs logits) is '
                    'written there.')
flags.mark_flag_as_required('logdir')

NUM_TRAIN_EXAMPLES = 60000


class _UserError(Exception):
  """A mistake in the flags or the setup: printed as one line, exit 2."""


def _CheckFlags() -> None:
  """Raises _UserError naming the first flag value that cannot run.

  Runs before TensorFlow is imported, so a typo costs no start-up time.
  """
  k, t, n = FLAGS.num_partitions, FLAGS.num_micro_batches, FLAGS.batch_size
  if k < 1:
    raise _UserError(f'--num_partitions={k} must be at least 1 (K, the '
                     'number of pipeline partitions, each on its own device)')
  if t < 1:
    raise _UserError(f'--num_micro_batches={t} must be at least 1 (T, the '
                     'number of micro-batches each batch is split into)')
  if n < 1 or n % t:
    fit = max(t, n - n % t)
    raise _UserError(f'--batch_size={n} is not a positive multiple of '
                     f'--num_micro_batches={t}; use a multiple of {t} '
                     f'(e.g. --batch_size={fit}) or change '
                     '--num_micro_batches')
  for name in ('epochs', 'steps_per_epoch', 'eval_steps'):
    value = getattr(FLAGS, name)
    if value is not None and value < 1:
      raise _UserError(f'--{name}={value} must be at least 1'
                       + ('' if name == 'epochs' else ' (or left out)'))
  if FLAGS.data_dir is not None and not os.path.isdir(
      paths.UserPath(FLAGS.data_dir)):
    raise _UserError(f'--data_dir={FLAGS.data_dir} is not a directory; pass '
                     'the folder of the prepared TFDS data (bash '
                     'tools/prepare_data.sh writes data/tfds) or leave it out')


def _Dataset(split: str, batch_size: int):
  """(image, label[, weight]) batches of the Fashion-MNIST input."""
  from tensorpipe import base_input  # pylint: disable=g-import-not-at-top
  from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
  inp = image_inputs.FashionMnistInput.Params().Set(
      name=split, split=split, batch_size=batch_size,
      data_dir=FLAGS.data_dir and paths.UserPath(FLAGS.data_dir)).Instantiate()

  def ToKeras(batch):
    if base_input.EXAMPLE_WEIGHT in batch:  # the padded last test batch
      return (batch.image, batch.label, batch[base_input.EXAMPLE_WEIGHT])
    return batch.image, batch.label
  return inp.Dataset().map(ToKeras)


def _Setup():
  """Flags -> (model, train data, test data); raises _UserError."""
  _CheckFlags()
  import tensorpipe  # pylint: disable=g-import-not-at-top
  tensorpipe.SetNumLogicalCpuDevices(FLAGS.num_partitions)
  import keras  # pylint: disable=g-import-not-at-top
  from models import keras_models  # pylint: disable=g-import-not-at-top
  from tensorpipe import keras_pipeline  # pylint: disable=g-import-not-at-top
  try:
    model = keras_pipeline.TensorPipeModel(
        keras_models.FashionMnistCnn(), num_partitions=FLAGS.num_partitions,
        num_micro_batches=FLAGS.num_micro_batches,
        batch_size=FLAGS.batch_size)
    print(model.pipeline.partition_plan.Report(
        [l.layer_name for l, _ in model.pipeline.LayersWithTheta()]))
    model.compile(
        optimizer=keras.optimizers.SGD(FLAGS.learning_rate, momentum=0.9,
                                       nesterov=True),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=['accuracy'])
    # Checks that the data set is prepared (a missing one fails here).
    train = _Dataset('train', FLAGS.batch_size)
    test = _Dataset('test', FLAGS.batch_size)
  except (ValueError, TypeError, OSError) as e:
    raise _UserError(f'{type(e).__name__}: {console.OneLine(e)}') from None
  if FLAGS.eval_steps:
    test = test.take(FLAGS.eval_steps)
  return model, train, test


def _Run(model, train, test) -> None:
  import keras  # pylint: disable=g-import-not-at-top
  logdir = paths.UserPath(FLAGS.logdir)
  os.makedirs(logdir, exist_ok=True)
  steps = FLAGS.steps_per_epoch or NUM_TRAIN_EXAMPLES // FLAGS.batch_size
  model.fit(train, epochs=FLAGS.epochs,
            steps_per_epoch=steps, validation_data=test, verbose=2,
            shuffle=False,  # the input shuffles itself
            callbacks=[
                keras.callbacks.TensorBoard(logdir),
                keras.callbacks.ModelCheckpoint(
                    os.path.join(logdir, 'model.keras')),
            ])
  results = model.evaluate(test, verbose=0, return_dict=True)
  print('test: ' + ', '.join(f'{k}={v:.4f}' for k, v in
                             sorted(results.items())))
  if FLAGS.export_dir:
    path = model.export_saved_model(paths.UserPath(FLAGS.export_dir),
                                    overwrite=True)
    print(f'exported the SavedModel to {path}')


def _Main(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  try:
    model, train, test = _Setup()
  except _UserError as e:
    print(f'keras_fit: error: {e}', file=sys.stderr)
    return 2
  from tensorpipe import base_input  # pylint: disable=g-import-not-at-top
  try:
    _Run(model, train, test)
  except (base_input.DataFileError, FloatingPointError) as e:
    print(f'keras_fit: error: {type(e).__name__}: {console.OneLine(e)}',
          file=sys.stderr)
    return 1
  return 0


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
