"""Step time of Keras models through the Keras front door, per K and schedule.

  python -m tools.keras_benchmark --models=MobileNetV2,ResNet50,DenseNet121 \
      --partitions=1,2,4 --steps=5
  python -m tools.keras_benchmark --models=gpt2 --partitions=1,2,4 \
      --schedules=gpipe,1f1b,zb_h1 --steps=5
  python -m tools.keras_benchmark --models=gpt2 --notime --w_share
  bazel run //tools:keras_benchmark -- --steps=5

--models takes keras.applications names (weights=None, --image_size
inputs, 10 classes, float32) and `gpt2`: a keras_hub
`GPT2CausalLM(preprocessor=None)` built from config (no download) with the
--gpt2_* sizes, fed random token ids (dict inputs token_ids /
padding_mask, the last pieces of every third row padded) and trained on
the next piece with Keras' loss and `sample_weight=padding_mask`, as
tools/keras_lm.py does. For each model, each K of --partitions and each
schedule of --schedules (K=1 runs gpipe only: the baseline), it builds the
TensorPipeModel (T=--num_micro_batches, batch --batch_size), times the
build, runs one training step to trace, then times --steps training steps
(`train_on_batch`). All in one process, on max(K) logical CPU devices
sharing the machine's cores, so the ratios (to K=1 GPipe) measure the
pipeline's overhead and, on a machine with a core per device, its speed-up.
Prints, per setting: the build time, the mean step time, its ratio to K=1
GPipe, the tensors and bytes crossing each cut. A setting that cannot be
built (e.g. more stages than the model has layers) is a row saying why.

--w_share counts, for the GPT-2 config under zb_v (K=2, v=2: four stages),
where its weight-gradient FLOPs run: per stage, the FLOPs (flops.OpFlops)
of the ops that only the weight-gradient sums of its traced W and I cells
need (cell_flops.WeightGradientFlopsPerCell), the share in W cells (issue
29's goal: at least 90%) and the ops that keep the rest in I.

Mistakes in the flags end in one line `keras_benchmark: error: ...` on
stderr (exit 2).
"""

# First, before anything imports TensorFlow: its C++ log lines off (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order

import collections
import math
import statistics
import sys
import time
from typing import Any, List, NamedTuple, Optional

from absl import app
from absl import flags

GPT2 = 'gpt2'

FLAGS = flags.FLAGS
flags.DEFINE_list('models', ['MobileNetV2', 'ResNet50', 'DenseNet121'],
                  'keras.applications model names, or gpt2 (a keras_hub '
                  'GPT2CausalLM of the --gpt2_* sizes).')
flags.DEFINE_list('partitions', ['1', '2', '4'], 'Values of K to time.')
flags.DEFINE_list('schedules', ['gpipe'], 'Training schedules to time at '
                  'each K > 1 (gpipe, 1f1b, zb_h1, zb_v, ...: '
                  'tensorpipe/schedule_builders.py); K=1 runs gpipe only, '
                  'the baseline of the ratios.')
flags.DEFINE_integer('num_micro_batches', 4, 'T.')
flags.DEFINE_integer('batch_size', 32, 'N, a multiple of T.')
flags.DEFINE_integer('image_size', 32, 'Input height and width of the '
                     'keras.applications models.')
flags.DEFINE_integer('steps', 5, 'Timed training steps per setting.')
flags.DEFINE_bool('time', True, 'Time the settings (--notime with --w_share: '
                  'only the count).')
flags.DEFINE_bool('w_share', False, 'Also report the share of the GPT-2 '
                  "config's weight-gradient FLOPs that zb_v (K=2, v=2) runs "
                  'in W cells.')
flags.DEFINE_integer('gpt2_vocabulary_size', 1024, 'GPT-2 vocabulary size '
                     '(token ids are drawn uniformly from it).')
flags.DEFINE_integer('gpt2_num_layers', 4, 'GPT-2 transformer blocks.')
flags.DEFINE_integer('gpt2_num_heads', 2, 'GPT-2 attention heads.')
flags.DEFINE_integer('gpt2_hidden_dim', 64, 'GPT-2 model width d (a multiple '
                     'of --gpt2_num_heads).')
flags.DEFINE_integer('gpt2_intermediate_dim', 128, 'GPT-2 feed-forward width.')
flags.DEFINE_integer('gpt2_sequence_length', 64, 'GPT-2 input length in '
                     'tokens (also its max_sequence_length).')

_GPT2_SIZES = ('gpt2_vocabulary_size', 'gpt2_num_layers', 'gpt2_num_heads',
               'gpt2_hidden_dim', 'gpt2_intermediate_dim',
               'gpt2_sequence_length')


class _UserError(Exception):
  """A mistake in the flags: printed as one line, exit 2."""


class _Row(NamedTuple):
  model: str
  layers: int
  k: int
  schedule: str
  build_s: Optional[float]
  step_s: Optional[float]
  ratio: Optional[float]
  cuts: Any  # [(tensors, bytes)] per cut, or the reason it did not build


def _Ints(name: str) -> List[int]:
  try:
    values = [int(v) for v in getattr(FLAGS, name)]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise _UserError(f'--{name}={",".join(getattr(FLAGS, name))} must be a '
                     'list of positive integers')
  return values


def _CheckFlags() -> List[int]:
  """The values of K; raises _UserError naming the first flag value that
  cannot run. Runs before TensorFlow is imported."""
  # pylint: disable=g-import-not-at-top
  from tensorpipe import schedule_builders
  from tensorpipe import schedules
  # pylint: enable=g-import-not-at-top
  ks = _Ints('partitions')
  t, n = FLAGS.num_micro_batches, FLAGS.batch_size
  if t < 1:
    raise _UserError(f'--num_micro_batches={t} must be at least 1')
  if n < 1 or n % t:
    raise _UserError(f'--batch_size={n} is not a positive multiple of '
                     f'--num_micro_batches={t}; use a multiple of {t}')
  if FLAGS.time and FLAGS.steps < 1:
    raise _UserError(f'--steps={FLAGS.steps} must be at least 1')
  if not FLAGS.models and FLAGS.time:
    raise _UserError('--models is empty; name keras.applications models or '
                     f'{GPT2}')
  known = schedule_builders.Names()
  for name in FLAGS.schedules:
    if name not in known and not schedules.IsCsvParam(name):
      raise _UserError(f'--schedules: unknown schedule {name!r}; use some of '
                       f'{",".join(known)}')
  if not FLAGS.schedules:
    raise _UserError(f'--schedules is empty; use some of {",".join(known)}')
  for name in _GPT2_SIZES + ('image_size',):
    if getattr(FLAGS, name) < 1:
      raise _UserError(f'--{name}={getattr(FLAGS, name)} must be at least 1')
  if FLAGS.gpt2_hidden_dim % FLAGS.gpt2_num_heads:
    raise _UserError(f'--gpt2_hidden_dim={FLAGS.gpt2_hidden_dim} is not a '
                     f'multiple of --gpt2_num_heads={FLAGS.gpt2_num_heads}')
  return ks


def _CheckModels(keras) -> None:
  """Raises _UserError for a --models name that is neither gpt2 nor a
  keras.applications model."""
  for name in FLAGS.models:
    if name != GPT2 and not callable(getattr(keras.applications, name, None)):
      raise _UserError(f'--models: unknown model {name!r}; use {GPT2} or '
                       'keras.applications names (e.g. MobileNetV2, ResNet50)')


def _Gpt2(keras):
  """The GPT-2 causal LM of the --gpt2_* sizes, float32, no dropout."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(1)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=FLAGS.gpt2_vocabulary_size,
      num_layers=FLAGS.gpt2_num_layers, num_heads=FLAGS.gpt2_num_heads,
      hidden_dim=FLAGS.gpt2_hidden_dim,
      intermediate_dim=FLAGS.gpt2_intermediate_dim, dropout=0.0,
      max_sequence_length=FLAGS.gpt2_sequence_length)
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _Gpt2Batch(np):
  """(x = {token_ids, padding_mask}, next-token labels, sample_weight)."""
  rng = np.random.RandomState(0)
  n, length = FLAGS.batch_size, FLAGS.gpt2_sequence_length
  ids = rng.randint(0, FLAGS.gpt2_vocabulary_size, (n, length)).astype(
      np.int32)
  mask = np.ones((n, length), np.int32)
  mask[::3, -(length // 4):] = 0  # some padded rows
  labels = np.roll(ids, -1, axis=1)
  return ({'token_ids': ids, 'padding_mask': mask}, labels,
          mask.astype(np.float32))


def _Setting(keras, np, name: str, k: int, schedule: str):
  """(model, TensorPipeModel, build seconds, (x, y, sample_weight), loss)."""
  from tensorpipe import keras_pipeline  # pylint: disable=g-import-not-at-top
  if name == GPT2:
    model = _Gpt2(keras)
    data = _Gpt2Batch(np)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  else:
    shape = (FLAGS.image_size, FLAGS.image_size, 3)
    rng = np.random.RandomState(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=shape,
                                              classes=10)
    data = (rng.rand(FLAGS.batch_size, *shape).astype(np.float32),
            rng.randint(0, 10, FLAGS.batch_size), None)
    loss = keras.losses.SparseCategoricalCrossentropy()
  start = time.time()
  pipe = keras_pipeline.TensorPipeModel(
      model, num_partitions=k, num_micro_batches=FLAGS.num_micro_batches,
      batch_size=FLAGS.batch_size, schedule=schedule)
  return model, pipe, time.time() - start, data, loss


def _Layers(name: str, model, pipe) -> int:
  """The model's Keras layers; GPT-2's once keras_nested flattened it (its
  own are the backbone and the preprocessor)."""
  if name == GPT2:
    return len(pipe.graph_pipeline.graph.entries)
  return len(model.layers)


def _TimeAll(keras, np, ks: List[int]) -> List[_Row]:
  rows = []
  for name in FLAGS.models:
    base = None
    for k in ks:
      for schedule in ['gpipe'] if k == 1 else FLAGS.schedules:
        try:
          model, pipe, build, (x, y, w), loss = _Setting(keras, np, name, k,
                                                         schedule)
        except ValueError as e:
          why = console.OneLine(e)
          print(f'{name} K={k} {schedule}: cannot build: {why}', flush=True)
          rows.append(_Row(name, 0, k, schedule, None, None, None, why))
          continue
        pipe.compile(keras.optimizers.SGD(0.01), loss)
        pipe.train_on_batch(x, y, sample_weight=w)  # traces
        times = []
        for _ in range(FLAGS.steps):
          start = time.time()
          pipe.train_on_batch(x, y, sample_weight=w)
          times.append(time.time() - start)
        step = statistics.mean(times)
        if k == 1:
          base = step
        ratio = step / base if base else None
        plan = pipe.graph_pipeline
        # Unknown dims (a sequence axis) count the model's length.
        cuts = [(len(keys), sum(plan.costs.Bytes(key, FLAGS.batch_size)
                                for key in keys))
                for keys in plan.plan.boundaries]
        rows.append(_Row(name, _Layers(name, model, pipe), k, schedule, build,
                         step, ratio, cuts))
        text = f'{ratio:.2f}x K=1 gpipe' if ratio else 'no K=1 row'
        print(f'{name} K={k} {schedule}: build {build:.1f} s, step '
              f'{1000 * step:.0f} ms ({text}), cuts {cuts}', flush=True)
  return rows


def _PrintTable(rows: List[_Row]) -> None:
  print()
  print('| model | layers | K | schedule | build s | step ms | / K=1 gpipe | '
        'cuts: tensors, bytes |')
  print('|---|---|---|---|---|---|---|---|')
  for r in rows:
    if r.step_s is None:
      print(f'| {r.model} | - | {r.k} | {r.schedule} | - | - | - | cannot '
            f'build: {r.cuts} |')
      continue
    cuts = '; '.join(f'{n}, {b}' for n, b in r.cuts) or '-'
    ratio = f'{r.ratio:.2f}' if r.ratio else '-'
    print(f'| {r.model} | {r.layers} | {r.k} | {r.schedule} | '
          f'{r.build_s:.1f} | {1000 * r.step_s:.0f} | {ratio} | {cuts} |')


def _WShare(keras, np) -> float:
  """Prints where the GPT-2 config's weight-gradient FLOPs run under zb_v
  (K=2, v=2); returns the share in W cells."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import cell_flops
  from tensorpipe import keras_pipeline
  from tensorpipe import py_utils
  from tensorpipe import schedule_builders
  from tensorpipe import schedule_program
  from tensorpipe.nested_map import NestedMap
  # pylint: enable=g-import-not-at-top
  k, v, t = 2, 2, FLAGS.num_micro_batches
  try:
    pipe = keras_pipeline.TensorPipeModel(
        _Gpt2(keras), num_partitions=k, num_micro_batches=t,
        batch_size=FLAGS.batch_size, schedule='zb_v')
  except ValueError as e:
    raise _UserError(f'--w_share: the GPT-2 config cannot run zb_v at K=2 '
                     f'({console.OneLine(e)})') from None
  layer = pipe.pipeline
  names = pipe.graph_pipeline.graph.input_names
  x, y, w = _Gpt2Batch(np)

  def LossSum(logits, targets):
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(targets.y, logits)
    return tf.reduce_sum(xent * targets.w)

  def Step(x, y, w):
    # The pipeline's training step with the loss inside, as
    # TensorPipeModel.train_step runs it (Keras' loss on the same logits).
    return layer.FPropLossAndGrads(
        layer.theta, tuple(x[name] for name in names), NestedMap(y=y, w=w),
        LossSum, tf.reduce_sum(w)).loss

  specs = (tf.nest.map_structure(tf.TensorSpec.from_tensor,
                                 tf.nest.map_structure(tf.constant, x)),
           tf.TensorSpec.from_tensor(tf.constant(y)),
           tf.TensorSpec.from_tensor(tf.constant(w)))
  with py_utils.TrainingMode(True):
    graph = cell_flops.Trace(Step, *specs)
  cells = schedule_program.Compile(schedule_builders.Build('zb_v', k, t,
                                                           v)).cells
  per_cell = cell_flops.WeightGradientFlopsPerCell(graph, cells)
  ops = cell_flops.WeightGradientOpsPerCell(graph, cells)
  share = cell_flops.WShare(per_cell)
  total = sum(n for (op, _), n in per_cell.items() if op in ('W', 'I'))
  print()
  print(f'weight-gradient FLOPs per micro-batch, GPT-2 ({FLAGS.gpt2_num_layers}'
        f' blocks, d={FLAGS.gpt2_hidden_dim}, ff={FLAGS.gpt2_intermediate_dim},'
        f' vocabulary {FLAGS.gpt2_vocabulary_size}, length '
        f'{FLAGS.gpt2_sequence_length}, {FLAGS.batch_size // t} rows), zb_v '
        f'K={k} v={v} T={t}:')
  print('| stage | W cell | I cell | in W | largest kept in I |')
  print('|---|---|---|---|---|')
  kept = collections.defaultdict(lambda: [0.0, set()])  # sublayer: FLOPs, ops
  for s in range(k * v):
    in_w, in_i = per_cell.get(('W', s), 0.0), per_cell.get(('I', s), 0.0)
    layers = collections.defaultdict(lambda: [0.0, set()])
    for (layer_name, op_type), n in ops.get(('I', s), {}).items():
      for key, table in ((layer_name, layers),
                         (layer_name.split('/')[-1], kept)):
        table[key][0] += n
        table[key][1].add(op_type)
    text = ', '.join(f'{name} {n:.0f} ({"/".join(sorted(types))})'
                     for name, (n, types) in sorted(
                         layers.items(), key=lambda kv: -kv[1][0])[:3]) or '-'
    frac = f'{in_w / (in_w + in_i):.1%}' if in_w + in_i else '-'
    print(f'| {s} | {in_w:.0f} | {in_i:.0f} | {frac} | {text} |')
  text = ', '.join(f'{name} {n / total:.1%} ({"/".join(sorted(types))})'
                   for name, (n, types) in sorted(
                       kept.items(), key=lambda kv: -kv[1][0])) or '-'
  goal = 'meets' if share >= 0.9 else 'misses'
  print(f'w_share: {100 * share:.1f}% of the weight-gradient FLOPs run in W '
        f'cells ({goal} the 90% goal); kept in I, of all: {text}', flush=True)
  return share


def _Run(ks: List[int]) -> None:
  # pylint: disable=g-import-not-at-top
  import keras
  import numpy as np
  import tensorpipe
  # pylint: enable=g-import-not-at-top
  _CheckModels(keras)
  tensorpipe.SetNumLogicalCpuDevices(max(ks + [2] if FLAGS.w_share else ks))
  if FLAGS.time:
    _PrintTable(_TimeAll(keras, np, ks))
  if FLAGS.w_share:
    share = _WShare(keras, np)
    if math.isnan(share):
      raise _UserError('--w_share: the traced step has no I or W cell')


def _Main(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  try:
    _Run(_CheckFlags())
  except _UserError as e:
    print(f'keras_benchmark: error: {e}', file=sys.stderr)
    return 2
  return 0


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
