"""Prints the paper's consistency table: loss and gradient norm for K = 1, 2, 4.

GPipe's claim (Huang et al. 2018, supplement figure 1): pipelining changes no
result. This binary runs the 16-layer 3x3 conv model without the pipeline and
as a TensorPipeLayer with K = 1, 2, 4 partitions (manual and automatic split)
and T micro-batches, and prints loss and global gradient norm for each, with
the largest relative difference to the unpipelined model. With --time_steps it
also reports the median step time of the unpipelined model (K=1, T=1) and of
the pipeline at the largest K and T.

  bazel run //tools:consistency
  python -m tools.consistency --num_micro_batches=8 --time_steps=20
"""

import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf

from models import consistency_cnn
import tensorpipe
from tensorpipe.layers import composite

FLAGS = flags.FLAGS
flags.DEFINE_integer('num_micro_batches', 8, 'T for the pipelined runs.',
                     lower_bound=1)
flags.DEFINE_list('num_partitions', ['1', '2', '4'], 'The K values to run.')
flags.register_validator(
    'num_partitions', lambda ks: bool(ks) and all(
        k.isdigit() and int(k) >= 1 for k in ks),
    message='each K must be an int >= 1, e.g. --num_partitions=1,2,4')
flags.DEFINE_integer('num_layers', 16, 'Number of 3x3 conv layers.',
                     lower_bound=1)
flags.DEFINE_integer('batch_size', 16, 'Mini-batch size N.', lower_bound=1)
flags.DEFINE_integer('seed', 1234, 'Seed of the random input.')
flags.DEFINE_integer('time_steps', 0, 'If > 0, also time this many training '
                     'steps (median) for the unpipelined model and the '
                     'pipeline with the largest K.')
flags.DEFINE_float('tolerance', 1e-6, 'Largest allowed relative difference; '
                   'the binary exits with status 1 above it.')


def _Run(argv):
  del argv
  ks = [int(k) for k in FLAGS.num_partitions]
  # Devices must exist before TensorFlow runs anything.
  tensorpipe.SetNumLogicalCpuDevices(max(ks))

  n, t = FLAGS.batch_size, FLAGS.num_micro_batches
  if n % t:
    raise app.UsageError(f'--batch_size={n} is not divisible by '
                         f'--num_micro_batches={t}')
  x = tf.random.uniform([n, 8, 8, 1], seed=FLAGS.seed)

  def MakeStep(layer):
    variables = layer.trainable_variables

    @tf.function(autograph=False)  # as the trainer's TrainStep
    def Step(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(layer.FPropDefaultTheta(x))
      grads = tape.gradient(loss, variables)
      return loss, tf.linalg.global_norm(grads)
    return Step

  layers = consistency_cnn.ConsistencyLayers(FLAGS.num_layers)
  rows = []
  plain = composite.SequentialLayer.Params().Set(
      name='Sequential', sub=layers).Instantiate()
  plain_step = MakeStep(plain)
  rows.append(('no pipeline', 1, 1, *plain_step(x)))
  pipes = {}
  for k in ks:
    size = FLAGS.num_layers // k
    manual = tensorpipe.TensorPipeLayer.Params().Set(
        name='TensorPipe', num_micro_batches=t, partitions=[
            layers[i * size:(i + 1) * size if i < k - 1 else None]
            for i in range(k)]).Instantiate()
    auto = consistency_cnn.ConsistencyPipeline(
        k, t, FLAGS.num_layers, (n, 8, 8, 1)).Instantiate()
    pipes[k] = auto
    rows.append(('pipeline, manual split', k, t, *MakeStep(manual)(x)))
    rows.append(('pipeline, automatic split', k, t, *MakeStep(auto)(x)))

  ref_loss, ref_norm = float(rows[0][3]), float(rows[0][4])
  print(f'Consistency: {FLAGS.num_layers} Conv2DLayers 3x3x1x1, input '
        f'[{n}, 8, 8, 1], loss = reduce_mean(output)\n')
  print('| model | K | T | loss | grad norm | rel. diff |')
  print('|---|---|---|---|---|---|')
  worst = 0.0
  for name, k, tt, loss, norm in rows:
    loss, norm = float(loss), float(norm)
    diff = max(abs(loss - ref_loss) / abs(ref_loss),
               abs(norm - ref_norm) / abs(ref_norm))
    worst = max(worst, diff)
    print(f'| {name} | {k} | {tt} | {loss:.9e} | {norm:.9e} | {diff:.1e} |')
  verdict = 'PASS' if worst <= FLAGS.tolerance else 'FAIL'
  print(f'\nlargest relative difference {worst:.2e} (tolerance '
        f'{FLAGS.tolerance:g}): {verdict}')

  if FLAGS.time_steps > 0:
    def Median(step):
      step(x)  # trace and warm up
      times = []
      for _ in range(FLAGS.time_steps):
        start = time.perf_counter()
        loss, _ = step(x)
        loss.numpy()
        times.append(time.perf_counter() - start)
      return statistics.median(times)
    base = Median(plain_step)
    kmax = max(ks)
    piped = Median(MakeStep(pipes[kmax]))
    print(f'\nmedian step time over {FLAGS.time_steps} steps: no pipeline '
          f'(K=1, T=1) {base * 1e3:.2f} ms; pipeline K={kmax}, T={t} '
          f'{piped * 1e3:.2f} ms ({piped / base:.2f}x)')
  return 0 if verdict == 'PASS' else 1


if __name__ == '__main__':
  app.run(_Run)
