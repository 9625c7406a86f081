"""tools/keras_lm end to end: a tiny keras_hub GPT-2 causal LM on Brown.

The tool trains the LM through TensorPipeModel at K=4 under ZB-H1 and at
K=1 from the same weights on the same batches, prints both test
perplexities next to the unigram one, exports the K=4 model and serves one
request from the SavedModel in a child process; this test also serves it
in a process that cannot import tensorpipe.
"""

import os
import re

import numpy as np
import tensorflow as tf

from tensorpipe import test_utils
from tests import export_testlib
from tests.tools import tool_testlib

# Both runs compute the same float32 ops per row; only the sums over rows
# are grouped differently (per micro-batch, then over T=4 of them). A sum of
# n = N L = 8 x 32 = 256 per-piece losses reordered moves by at most about
# n u = 256 x 2^-24 = 1.5e-5 of its value; the 4 Adam steps before the
# last logged loss start from gradients equal to the same bound.
_LOSS_RTOL = 256 * 2.0**-24


def _Floats(pattern: str, text: str):
  return [float(v) for v in re.search(pattern, text).group(1).split()]


class KerasLmToolTest(tf.test.TestCase):

  def testK4ZeroBubbleTrainsAsK1AndTheExportServes(self):
    test_utils.CheckPrepared(self, 'brown_corpus')
    tmp = self.get_temp_dir()
    export_dir = os.path.join(tmp, 'export')
    proc = tool_testlib.RunTool(
        'keras_lm', '--steps=4', '--log_every=2', '--eval_batches=2',
        '--batch_size=8', '--seq_len=32', '--num_layers=2',
        '--hidden_dim=32', '--num_heads=2', f'--export_dir={export_dir}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = proc.stdout
    self.assertIn('tied: token_embedding', out)
    k4 = _Floats(r'training loss per epoch, K=4: ([\d. ]+)', out)
    k1 = _Floats(r'training loss per epoch, K=1: ([\d. ]+)', out)
    self.assertLen(k4, 2)
    np.testing.assert_allclose(k4, k1, rtol=_LOSS_RTOL)
    self.assertRegex(out, r'test perplexity after 4 steps: K=4 zb_h1 [\d.]+, '
                     r'K=1 [\d.]+ \(ratio [\d.]+\), unigram [\d.]+')
    served = float(re.search(r'max \|served - pipeline predict\| = (\S+)',
                             out).group(1))
    self.assertLess(served, 1e-4)
    tokens = np.arange(32, dtype=np.int32)[np.newaxis] % 100
    loaded = export_testlib.RunInCleanProcess(
        export_dir, [{'token_ids': tokens,
                      'padding_mask': np.ones_like(tokens)}], tmp)
    self.assertEqual(loaded.modules, [])
    (logits,) = loaded.outputs[0].values()
    self.assertEqual(logits.shape, (1, 32, 8000))

  def testBadFlagIsOneLine(self):
    proc = tool_testlib.RunTool('keras_lm', '--batch_size=6',
                                '--num_micro_batches=4')
    self.assertEqual(proc.returncode, 2)
    self.assertEqual(proc.stderr.strip().splitlines()[-1],
                     'keras_lm: error: --batch_size=6 is not a positive '
                     'multiple of --num_micro_batches=4; use a multiple of 4')


if __name__ == '__main__':
  tf.test.main()
