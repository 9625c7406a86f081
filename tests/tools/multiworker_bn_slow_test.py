"""Two worker processes train the batch-norm ResNet exactly as one process.

multiworker_slow_test checks the launcher on the consistency CNN, which has
no batch norm. Here the default Fashion-MNIST experiment (a ResNet with batch
norm in every block) runs 6 steps with K=2 partitions in float64
(`task.dtype`):

  * R=1, no cluster, T=8 micro-batches of 16: the reference;
  * R=2 worker processes on 127.0.0.1 via tools/launch, T=4 each,

so both compute the same function on the same micro-batches. In float32 the
two runs drift apart after a few steps (the all-reduce adds the replicas'
gradient sums in another order and training amplifies the rounding); in
float64 that rounding is ~1e-16, so the weights and optimizer slots must
agree to 1e-12 and the batch-norm moving statistics, which are summed in
float32 (normalization.py), to float32 rounding. A wrong count or sum in the
cross-worker all-reduce of the batch statistics, or a replica drawing
another replica's dropout masks, would show as an O(1e-3) difference.

The same pair again in float32 with `grad_sum='pairwise'`
(tensorpipe/grad_sum.py): the gradient sums then have the same shape in
both runs, and the weights and optimizer slots must be equal to the bit.
"""

import shutil
import tempfile
import unittest

import numpy as np

from tests.tools import tool_testlib

_MODEL = 'image.fashion_mnist.ResNet4x8'
_STEPS = 6
_TIMEOUT_S = 600


def _Flags(logdir, num_micro_batches, exact=''):
  return [f'--model={_MODEL}', f'--logdir={logdir}', '--mode=train',
          f'--max_steps={_STEPS}',
          '--model_params_override=task.model.num_partitions=2; '
          f'task.model.num_micro_batches={num_micro_batches}; '
          f'{exact}; '
          f'task.train.save_interval_steps={_STEPS}; '
          'task.train.summary_interval_steps=1']


_FLOAT64 = 'task.dtype=dtype:float64'
# float32, micro-batch gradients summed as a tree (tensorpipe/grad_sum.py).
_PAIRWISE = "task.model.grad_sum='pairwise'"


class MultiWorkerBatchNormTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='multiworker_bn_')
    cls.r1 = f'{cls.tmp}/r1'
    cls.w2 = f'{cls.tmp}/w2'
    cls.runs = {}
    for name, exact in (('', _FLOAT64), ('_pairwise', _PAIRWISE)):
      cls.runs['r1' + name] = tool_testlib.RunTool(
          'trainer', *_Flags(f'{cls.tmp}/r1{name}', 8, exact),
          timeout_s=_TIMEOUT_S)
      cls.runs['w2' + name] = tool_testlib.RunTool(
          'launch', '--num_workers=2', f'--timeout_s={_TIMEOUT_S - 20}', '--',
          *_Flags(f'{cls.tmp}/w2{name}', 4, exact), timeout_s=_TIMEOUT_S)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def testWorkersEqualTheSingleProcessRunInFloat64(self):
    for name in ('r1', 'w2'):
      run = self.runs[name]
      self.assertEqual(run.returncode, 0, msg=f'{name}:\n{run.stderr[-3000:]}')
    want = tool_testlib.CheckpointTensors(self.r1)
    got = tool_testlib.CheckpointTensors(self.w2)
    self.assertEqual(sorted(got), sorted(want))
    moving = [k for k in want if '/moving_' in k]
    self.assertTrue(moving, msg="no batch-norm moving statistics")
    for key, value in want.items():
      value = np.asarray(value)
      if value.dtype.kind != 'f':
        continue
      scale = max(float(np.max(np.abs(value))), 1e-30)
      rtol = 1e-5 if key in moving else 1e-12
      np.testing.assert_allclose(got[key], value, rtol=0, atol=rtol * scale,
                                 err_msg=key)
    # The per-step losses agree as well (summaries are float32).
    np.testing.assert_allclose(tool_testlib.SummaryScalars(self.w2),
                               tool_testlib.SummaryScalars(self.r1),
                               rtol=1e-6)

  def testPairwiseSumWorkersEqualTheSingleProcessBitForBitInFloat32(self):
    """grad_sum='pairwise': each worker's tree over its 4 micro-batches is
    half of the single process's tree over 8, and the all-reduce adds the
    halves: the same float32 gradients, so the same weights to the bit.
    Batch-norm moving statistics are sums of another shape (the all-reduce
    adds the replicas' sums): float32 rounding, not checked bitwise."""
    for name in ('r1_pairwise', 'w2_pairwise'):
      run = self.runs[name]
      self.assertEqual(run.returncode, 0, msg=f'{name}:\n{run.stderr[-3000:]}')
    want = tool_testlib.CheckpointTensors(f'{self.tmp}/r1_pairwise')
    got = tool_testlib.CheckpointTensors(f'{self.tmp}/w2_pairwise')
    self.assertEqual(sorted(got), sorted(want))
    checked = 0
    for key, value in want.items():
      value = np.asarray(value)
      if value.dtype.kind != 'f' or '/moving_' in key:
        continue
      np.testing.assert_array_equal(got[key], value, err_msg=key)
      checked += 1
    self.assertGreater(checked, 20)
    losses = tool_testlib.SummaryScalars(f'{self.tmp}/r1_pairwise')
    self.assertEqual(len(losses), _STEPS)
    np.testing.assert_allclose(
        tool_testlib.SummaryScalars(f'{self.tmp}/w2_pairwise'), losses,
        rtol=1e-6)


if __name__ == '__main__':
  unittest.main()
