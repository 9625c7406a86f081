"""Tests of tensorpipe/evaluation.py with a fake task (trainer_lib_test and
eval_coverage_test evaluate real models)."""

import io

import numpy as np
import tensorflow as tf

from tensorpipe import evaluation
from tensorpipe import preemption
from tensorpipe.nested_map import NestedMap


class _Task:
  """Metrics: the mean of x over the real rows; no decoding metrics."""

  def CreateDecodeMetrics(self, eval_input):
    del eval_input  # unused
    return None

  def AggregateMetrics(self, per_batch):
    total = sum(v * w for v, w in (m['x'] for m in per_batch))
    weight = sum(w for _, w in (m['x'] for m in per_batch))
    return {'x': total / weight}

  def PostProcessEvalMetrics(self, metrics):
    return dict(metrics, doubled=2 * metrics['x'])


def _Step(batch):
  w = tf.cast(batch.weight, tf.float32)
  return {'x': (tf.reduce_sum(batch.x * w) / tf.reduce_sum(w),
                tf.reduce_sum(w))}


def _Dataset(rows, batch_size=2):
  x = np.arange(rows, dtype=np.float32)
  weight = np.ones(rows, np.float32)
  return tf.data.Dataset.from_tensor_slices(
      dict(x=x, weight=weight)).batch(batch_size).map(NestedMap)


class EvaluateTest(tf.test.TestCase):

  def _Evaluate(self, dataset, eval_steps=None, stop=None):
    self.log = []
    return evaluation.Evaluate(_Task(), _Step, None, dataset, eval_steps, 2,
                               stop, self.log.append)

  def testWeightedMeansOverTheWholeSplitOrEvalSteps(self):
    metrics = self._Evaluate(_Dataset(6))
    self.assertEqual(metrics, {'x': 2.5, 'doubled': 5.0, 'num_batches': 3.0,
                               'num_examples': 6.0})
    metrics = self._Evaluate(_Dataset(6), eval_steps=1)
    self.assertEqual((metrics['x'], metrics['num_batches']), (0.5, 1.0))

  def testAStopRequestEndsItWithoutResults(self):
    stop = preemption.StopSignals(out=io.StringIO(), exit_fn=lambda _: None)
    stop.Arm()
    stop._Handle(15, None)  # pylint: disable=protected-access
    self.assertEqual(self._Evaluate(_Dataset(6), stop=stop), {})
    self.assertEqual(self.log, ['evaluation ended by SIGTERM after 0 '
                                'batches: no eval results written'])

  def testAnEmptySplitIsAnError(self):
    with self.assertRaisesRegex(ValueError, 'gave no batch.*batch_size=2'):
      self._Evaluate(_Dataset(0))


if __name__ == '__main__':
  tf.test.main()
