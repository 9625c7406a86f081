"""Step time of keras.applications models through the Keras front door.

  python -m tools.keras_benchmark --models=MobileNetV2,ResNet50,DenseNet121 \
      --partitions=1,2,4 --steps=5
  bazel run //tools:keras_benchmark -- --steps=5

For each model (weights=None, --image_size inputs, 10 classes, float32) and
each K: builds the TensorPipeModel (T=--num_micro_batches, batch
--batch_size), times the build, runs one training step to trace, then times
--steps training steps (`train_on_batch`). All in one process, on K logical
CPU devices sharing the machine's cores, so the ratios (K / K=1) measure the
pipeline's overhead and, on a machine with a core per device, its speed-up.
Prints, per model and K: the build time, the mean step time, its ratio to
K=1, the tensors and bytes crossing each cut.
"""

# First, before anything imports TensorFlow: its C++ log lines off (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order

import statistics
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_list('models', ['MobileNetV2', 'ResNet50', 'DenseNet121'],
                  'keras.applications model names.')
flags.DEFINE_list('partitions', ['1', '2', '4'], 'Values of K to time.')
flags.DEFINE_integer('num_micro_batches', 4, 'T.')
flags.DEFINE_integer('batch_size', 32, 'N, a multiple of T.')
flags.DEFINE_integer('image_size', 32, 'Input height and width.')
flags.DEFINE_integer('steps', 5, 'Timed training steps per setting.')


def _Run(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  ks = [int(k) for k in FLAGS.partitions]
  # pylint: disable=g-import-not-at-top
  import keras
  import numpy as np
  import tensorpipe
  tensorpipe.SetNumLogicalCpuDevices(max(ks))
  from tensorpipe import keras_pipeline
  # pylint: enable=g-import-not-at-top
  shape = (FLAGS.image_size, FLAGS.image_size, 3)
  rng = np.random.RandomState(0)
  x = rng.rand(FLAGS.batch_size, *shape).astype(np.float32)
  y = rng.randint(0, 10, FLAGS.batch_size)
  rows = []
  for name in FLAGS.models:
    factory = getattr(keras.applications, name)
    base = None
    for k in ks:
      model = factory(weights=None, input_shape=shape, classes=10)
      start = time.time()
      pipe = keras_pipeline.TensorPipeModel(
          model, num_partitions=k, num_micro_batches=FLAGS.num_micro_batches,
          batch_size=FLAGS.batch_size)
      build = time.time() - start
      pipe.compile(keras.optimizers.SGD(0.01),
                   keras.losses.SparseCategoricalCrossentropy())
      pipe.train_on_batch(x, y)  # traces
      times = []
      for _ in range(FLAGS.steps):
        start = time.time()
        pipe.train_on_batch(x, y)
        times.append(time.time() - start)
      step = statistics.mean(times)
      base = base or step
      plan = pipe.graph_pipeline
      cuts = [(len(keys), sum(plan.costs.tensors[key].Bytes(FLAGS.batch_size)
                              for key in keys))
              for keys in plan.plan.boundaries]
      rows.append((name, len(model.layers), k, build, step, step / base,
                   cuts))
      print(f'{name} K={k}: build {build:.1f} s, step {1000 * step:.0f} ms '
            f'({step / base:.2f}x K=1), cuts {cuts}', flush=True)
  print()
  print('| model | layers | K | build s | step ms | / K=1 | cuts: tensors, '
        'bytes |')
  print('|---|---|---|---|---|---|---|')
  for name, layers, k, build, step, ratio, cuts in rows:
    text = '; '.join(f'{n}, {b}' for n, b in cuts) or '-'
    print(f'| {name} | {layers} | {k} | {build:.1f} | {1000 * step:.0f} | '
          f'{ratio:.2f} | {text} |')


def main():
  app.run(_Run)


if __name__ == '__main__':
  main()
