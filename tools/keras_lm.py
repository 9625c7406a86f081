"""Trains a keras_hub GPT-2 causal LM on the Brown corpus, pipelined vs not.

A small `keras_hub.models.GPT2CausalLM(backbone=GPT2Backbone(...),
preprocessor=None)` built from config (no download; its token table is tied
to the output softmax) reads the project's Brown input
(tensorpipe/inputs/lm_input.py: the project's own SentencePiece vocabulary,
windows of --seq_len pieces) and is trained twice from the same initial
weights and data order: through `TensorPipeModel` at K=--num_partitions
with --schedule (a zero-bubble one by default), and at K=1 under the
same schedule. Both use
Keras' loss with `sample_weight=padding_mask`, as keras_hub's causal LMs
do. It prints the test perplexity of each next to the corpus's unigram
perplexity (training-split piece counts, add-one smoothed, on the test
split), then, with --export_dir, exports the pipelined model as a
SavedModel and serves one request from it in a child process that never
imports tensorpipe.

  python -m tools.keras_lm --steps=300 --export_dir=/tmp/gpt2_brown

Mistakes end in one line `keras_lm: error: ...` on stderr (exit 2), as
tools/keras_fit.py.
"""

# First, before anything imports TensorFlow: its C++ log lines off (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order

import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, NamedTuple

from absl import app
from absl import flags
import numpy as np

from tools import paths

FLAGS = flags.FLAGS
flags.DEFINE_integer('steps', 300, 'Training steps of each run.')
flags.DEFINE_integer('log_every', 50, 'Steps per Keras epoch (one console '
                     'line each).')
flags.DEFINE_integer('eval_batches', None, 'Test batches to evaluate (the '
                     'unigram model too); default the whole test split.')
flags.DEFINE_integer('batch_size', 16, 'Mini-batch N in windows (a multiple '
                     'of T).')
flags.DEFINE_integer('seq_len', 64, 'Window length in pieces.')
flags.DEFINE_integer('num_partitions', 4, 'K of the pipelined run.')
flags.DEFINE_integer('num_micro_batches', 4, 'T (both runs).')
flags.DEFINE_string('schedule', 'zb_h1', 'Schedule of both runs (at K=1 '
                    'it keeps the per-micro-batch loss sums and their '
                    'order, so the two runs differ only where K cuts).')
flags.DEFINE_integer('num_layers', 4, 'GPT-2 blocks.')
flags.DEFINE_integer('hidden_dim', 64, 'GPT-2 model width d.')
flags.DEFINE_integer('num_heads', 4, 'Attention heads.')
flags.DEFINE_float('learning_rate', 2e-3, 'Adam learning rate.')
flags.DEFINE_integer('seed', 1, 'Seed of the initial weights (both runs).')
flags.DEFINE_string('data_dir', None, 'Prepared TFDS data (default: data/tfds '
                    'or $TENSORPIPE_DATA_DIR).')
flags.DEFINE_string('export_dir', None, 'If set, the pipelined model is '
                    'exported there and serves one request.')

VOCAB_SIZE = 8000   # the project's Brown SentencePiece vocabulary


class _UserError(Exception):
  """A mistake in the flags or the setup: printed as one line, exit 2."""


class RunResult(NamedTuple):
  losses: List[float]       # training loss per Keras epoch (log_every steps)
  test_xent: float          # nats per piece on the test split
  model: object             # the TensorPipeModel


def _CheckFlags() -> None:
  """Raises _UserError naming the first flag value that cannot run."""
  t, n = FLAGS.num_micro_batches, FLAGS.batch_size
  for name in ('steps', 'log_every', 'seq_len', 'num_partitions',
               'num_micro_batches', 'num_layers', 'hidden_dim', 'num_heads'):
    if getattr(FLAGS, name) < 1:
      raise _UserError(f'--{name}={getattr(FLAGS, name)} must be at least 1')
  if n < 1 or n % t:
    raise _UserError(f'--batch_size={n} is not a positive multiple of '
                     f'--num_micro_batches={t}; use a multiple of {t}')
  if FLAGS.steps % FLAGS.log_every:
    raise _UserError(f'--steps={FLAGS.steps} is not a multiple of '
                     f'--log_every={FLAGS.log_every}')
  if FLAGS.hidden_dim % FLAGS.num_heads:
    raise _UserError(f'--hidden_dim={FLAGS.hidden_dim} is not a multiple of '
                     f'--num_heads={FLAGS.num_heads}')


def _Input(split: str, batch_size: int, repeat=None):
  """The Brown input; the test split cut to --eval_batches batches."""
  from tensorpipe.inputs import lm_input  # pylint: disable=g-import-not-at-top
  rows = FLAGS.eval_batches and FLAGS.eval_batches * FLAGS.batch_size
  return lm_input.BrownLmInput.Params().Set(
      name=split, split=split, batch_size=batch_size, seq_len=FLAGS.seq_len,
      vocab_size=VOCAB_SIZE, repeat=repeat,
      max_examples=rows if split == 'test' else None,
      data_dir=FLAGS.data_dir and paths.UserPath(FLAGS.data_dir)
  ).Instantiate()


def _Weights(batch):
  """[b, seq_len] float32: 1 on real pieces of real rows."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorpipe import base_input  # pylint: disable=g-import-not-at-top
  w = 1.0 - batch.paddings
  if base_input.EXAMPLE_WEIGHT in batch:  # the padded last test batch
    w *= batch[base_input.EXAMPLE_WEIGHT][:, tf.newaxis]
  return w


def KerasDataset(split: str):
  """(x, y, sample_weight) batches: x = {token_ids, padding_mask}."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def ToKeras(batch):
    mask = tf.cast(1.0 - batch.paddings, tf.int32)
    x = {'token_ids': batch.ids, 'padding_mask': mask}
    return x, batch.labels, _Weights(batch)
  return _Input(split, FLAGS.batch_size).Dataset().map(ToKeras)


def UnigramXent(train_counts: np.ndarray, test_counts: np.ndarray) -> float:
  """Nats per test piece of the add-one smoothed training unigram model."""
  p = (train_counts + 1.0) / (train_counts.sum() + len(train_counts))
  return float(-(test_counts * np.log(p)).sum() / test_counts.sum())


def _Counts(split: str) -> np.ndarray:
  """[VOCAB_SIZE] counts of the split's target pieces (real ones only)."""
  from tensorpipe import base_input  # pylint: disable=g-import-not-at-top
  counts = np.zeros([VOCAB_SIZE], np.float64)
  for batch in _Input(split, 1024, repeat=False).Dataset().as_numpy_iterator():
    w = 1.0 - batch['paddings']
    if base_input.EXAMPLE_WEIGHT in batch:
      w = w * batch[base_input.EXAMPLE_WEIGHT][:, None]
    counts += np.bincount(batch['labels'].ravel(), weights=w.ravel(),
                          minlength=VOCAB_SIZE)
  return counts


def _Gpt2Lm():
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(FLAGS.seed)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=VOCAB_SIZE, num_layers=FLAGS.num_layers,
      num_heads=FLAGS.num_heads, hidden_dim=FLAGS.hidden_dim,
      intermediate_dim=4 * FLAGS.hidden_dim, dropout=0.0,
      max_sequence_length=FLAGS.seq_len)
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _Train(num_partitions: int, schedule: str) -> RunResult:
  """Builds, fits and evaluates one run; prints its console lines."""
  import keras  # pylint: disable=g-import-not-at-top
  from tensorpipe import keras_pipeline  # pylint: disable=g-import-not-at-top
  print(f'--- K={num_partitions}, T={FLAGS.num_micro_batches}, '
        f'schedule={schedule}', flush=True)
  model = keras_pipeline.TensorPipeModel(
      _Gpt2Lm(), num_partitions=num_partitions,
      num_micro_batches=FLAGS.num_micro_batches,
      batch_size=FLAGS.batch_size, schedule=schedule)
  if num_partitions > 1:
    print(model.graph_pipeline.Report())
  xent = keras.metrics.SparseCategoricalCrossentropy(from_logits=True,
                                                     name='xent')
  model.compile(
      optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      weighted_metrics=[xent])
  history = model.fit(KerasDataset('train'),
                      epochs=FLAGS.steps // FLAGS.log_every,
                      steps_per_epoch=FLAGS.log_every, verbose=2,
                      shuffle=False)
  test = model.evaluate(KerasDataset('test'), verbose=0, return_dict=True)
  print(f'test: xent={test["xent"]:.4f} perplexity='
        f'{math.exp(test["xent"]):.2f}', flush=True)
  return RunResult(history.history['loss'], test['xent'], model)


_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
export_dir, request, out = sys.argv[1:4]
serve = tf.saved_model.load(export_dir).signatures['serving_default']
with np.load(request) as data:
  got = serve(**{k: tf.constant(data[k]) for k in data.files})
np.savez(out, **{k: v.numpy() for k, v in got.items()})
print(json.dumps(sorted(m for m in sys.modules
                        if m.split('.')[0] == 'tensorpipe')))
"""


def ServeInChild(export_dir: str, request: Dict[str, np.ndarray]
                 ) -> Dict[str, np.ndarray]:
  """Runs the SavedModel's serving_default in a process without tensorpipe.

  Raises:
    RuntimeError: the child failed or imported tensorpipe.
  """
  with tempfile.TemporaryDirectory() as tmp:
    np.savez(os.path.join(tmp, 'request.npz'), **request)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    env.pop('PYTHONPATH', None)
    proc = subprocess.run(
        [sys.executable, '-c', _SERVE, os.path.abspath(export_dir),
         'request.npz', 'out.npz'], cwd=tmp, env=env, capture_output=True,
        text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f'serving failed: {proc.stderr[-2000:]}')
    if json.loads(proc.stdout.strip().splitlines()[-1]):
      raise RuntimeError(f'the serving process imported tensorpipe: '
                         f'{proc.stdout}')
    with np.load(os.path.join(tmp, 'out.npz')) as data:
      return {k: data[k] for k in data.files}


def _ExportAndServe(model) -> None:
  path = model.export(paths.UserPath(FLAGS.export_dir))
  print(f'exported the SavedModel to {path}')
  inp = _Input('test', 1)
  batch = next(iter(inp.Dataset()))
  request = {'token_ids': batch.ids.numpy()[:1],
             'padding_mask': np.ones_like(batch.ids.numpy()[:1])}
  served = ServeInChild(path, request)
  (logits,) = served.values()
  want = model.predict(
      {k: np.repeat(v, FLAGS.batch_size, 0) for k, v in request.items()},
      batch_size=FLAGS.batch_size, verbose=0)[:1]
  ids = request['token_ids'][0]
  print(f'served one request (no tensorpipe in the process): '
        f'{logits.shape} logits, max |served - pipeline predict| = '
        f'{np.abs(logits - want).max():.2e}')
  print(f'  prompt: {inp.vocab.Decode(ids[-12:].tolist())!r}')
  print(f'  next piece: {inp.vocab.Decode([int(logits[0, -1].argmax())])!r}')


def _Run() -> None:
  test_counts = _Counts('test')
  unigram = UnigramXent(_Counts('train'), test_counts)
  print(f'test: {int(test_counts.sum())} target pieces; unigram '
        f'perplexity {math.exp(unigram):.2f}', flush=True)
  plain = _Train(1, FLAGS.schedule)
  pipe = _Train(FLAGS.num_partitions, FLAGS.schedule)
  ppl = {name: math.exp(r.test_xent) for name, r in
         (('pipe', pipe), ('plain', plain))}
  print(f'\ntest perplexity after {FLAGS.steps} steps: '
        f'K={FLAGS.num_partitions} {FLAGS.schedule} {ppl["pipe"]:.2f}, '
        f'K=1 {ppl["plain"]:.2f} (ratio {ppl["pipe"] / ppl["plain"]:.4f}), '
        f'unigram {math.exp(unigram):.2f}')
  print('training loss per epoch, K=%d: %s' % (
      FLAGS.num_partitions, ' '.join(f'{v:.6f}' for v in pipe.losses)))
  print('training loss per epoch, K=1: %s' % ' '.join(
      f'{v:.6f}' for v in plain.losses))
  if FLAGS.export_dir:
    _ExportAndServe(pipe.model)


def _Main(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  try:
    _CheckFlags()
    import tensorpipe  # pylint: disable=g-import-not-at-top
    tensorpipe.SetNumLogicalCpuDevices(FLAGS.num_partitions)
    print(f'vocabulary: {_Input("train", 1).vocab.size} pieces')
  except (_UserError, ValueError, OSError) as e:
    print(f'keras_lm: error: {console.OneLine(e)}', file=sys.stderr)
    return 2
  _Run()
  return 0


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
