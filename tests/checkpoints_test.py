"""Tests of tensorpipe.checkpoints on a small tf.Module (no trainer)."""

import os
import shutil
import tempfile

import tensorflow as tf

from tensorpipe import checkpoints


class _Layer(tf.Module):

  def __init__(self, name, shape):
    super().__init__(name=name)
    self.w = tf.Variable(tf.zeros(shape), name='w')


class _Model(tf.Module):
  """Variables under nested names, one with a '/' and a '.' in its name."""

  def __init__(self, shape=(3, 2), second='dense.1'):
    super().__init__()
    self.layers = {'conv/0': _Layer('a', [2, 2]), second: _Layer('b', shape)}
    self.bias = tf.Variable(tf.zeros([2]), name='bias')


def _Save(directory, model, step, value):
  for v in model.trainable_variables:
    v.assign(tf.fill(v.shape, float(value)))
  ckpt = tf.train.Checkpoint(model=model, step=tf.Variable(step))
  manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=5)
  return manager.save(checkpoint_number=step)


class CheckpointsTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    self.log = []

  def _SaveThree(self):
    model = _Model()
    for n in (1, 2, 3):
      _Save(self.dir, model, n, n)
    return model

  def _Restore(self, model=None):
    model = model or _Model()
    step = tf.Variable(0)
    path = checkpoints.RestoreNewest(
        tf.train.Checkpoint(model=model, step=step), dict(model=model),
        self.dir, self.log.append, lambda: 'a run of X')
    return path, model, int(step.numpy())

  def testVariableKeysAreTheKeysTensorFlowSaves(self):
    model = _Model()
    prefix = _Save(self.dir, model, 1, 1)
    saved = set(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
    saved -= {'_CHECKPOINTABLE_OBJECT_GRAPH',
              'save_counter/.ATTRIBUTES/VARIABLE_VALUE',
              'step/.ATTRIBUTES/VARIABLE_VALUE'}
    self.assertEqual(set(checkpoints.VariableKeys(dict(model=model))), saved)
    self.assertIn('model/layers/conv.S0/w/.ATTRIBUTES/VARIABLE_VALUE', saved)
    self.assertIn('model/layers/dense..1/w/.ATTRIBUTES/VARIABLE_VALUE', saved)

  def testVariableDiffNamesWhatDiffers(self):
    prefix = _Save(self.dir, _Model(), 1, 1)
    reader = tf.train.load_checkpoint(prefix)
    saved = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    self.assertEqual(checkpoints.VariableDiff(
        checkpoints.VariableKeys(dict(model=_Model())), saved, dtypes), [])
    other = _Model(shape=(4, 2), second='dense.2')
    other.bias = tf.Variable(tf.zeros([2], tf.float64), name='bias')
    self.assertEqual(
        checkpoints.VariableDiff(checkpoints.VariableKeys(dict(model=other)),
                                 saved, dtypes),
        ['model/bias: float64 here, float32 in the checkpoint',
         'model/layers/dense.2/w (not in the checkpoint)',
         'model/layers/dense.1/w (only in the checkpoint)'])
    # Outside the strict prefixes the checkpoint may hold more.
    self.assertEqual(checkpoints.VariableDiff(
        checkpoints.VariableKeys(dict(model=_Model())), saved, dtypes,
        strict_prefixes=('nothing/',)), [])

  def testRestoresTheNewest(self):
    self._SaveThree()
    path, model, step = self._Restore()
    self.assertEqual(os.path.basename(path), 'ckpt-3')
    self.assertEqual(step, 3)
    self.assertAllEqual(model.bias, [3., 3.])
    self.assertEqual(self.log, [])

  def testDamagedNewestFallsBackWithAWarningNamingTheFile(self):
    self._SaveThree()
    data = os.path.join(self.dir, 'ckpt-3.data-00000-of-00001')
    with open(data, 'r+b') as f:
      f.truncate(10)
    os.remove(os.path.join(self.dir, 'ckpt-2.index'))
    path, model, step = self._Restore()
    self.assertEqual((os.path.basename(path), step), ('ckpt-1', 1))
    self.assertAllEqual(model.bias, [1., 1.])  # nothing of ckpt-3 is left
    self.assertEqual(len(self.log), 3, self.log)
    self.assertIn(data, self.log[0])
    self.assertIn(os.path.join(self.dir, 'ckpt-2.index'), self.log[1])
    self.assertIn('restored', self.log[2])

  def testCorruptedNewestFallsBackToThePreviousOneNamingTheFile(self):
    """Files of the right name and size whose bytes are damaged: a newest
    index cut in half (TF cannot read its table), or a newest data file
    with every byte flipped (same length: only the per-tensor checksums
    in the index tell). Each time ckpt-2 is restored, all of it, and the
    log names the damaged file, then the checkpoint restored."""
    index = os.path.join(self.dir, 'ckpt-3.index')
    data = os.path.join(self.dir, 'ckpt-3.data-00000-of-00001')
    for damaged, how in ((index, 'is damaged'), (data, 'failed')):
      with self.subTest(damaged=os.path.basename(damaged)):
        shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        del self.log[:]
        self._SaveThree()
        with open(damaged, 'rb') as f:
          content = f.read()
        with open(damaged, 'wb') as f:
          if damaged == index:
            f.write(content[:len(content) // 2])
          else:
            f.write(bytes(b ^ 0xFF for b in content))
        path, model, step = self._Restore()
        self.assertEqual((os.path.basename(path), step), ('ckpt-2', 2))
        self.assertAllEqual(model.bias, [2., 2.])
        self.assertAllEqual(model.layers['dense.1'].w, tf.fill([3, 2], 2.))
        self.assertLen(self.log, 2, self.log)
        self.assertIn(damaged, self.log[0])
        self.assertIn(how, self.log[0])
        self.assertIn('restored ' + os.path.join(self.dir, 'ckpt-2'),
                      self.log[1])
        self.assertIn('ckpt-3', self.log[1])

  def testNoUsableCheckpointRaisesAndNoCheckpointIsNone(self):
    self.assertIsNone(self._Restore()[0])
    self._SaveThree()
    for n in (1, 2, 3):
      os.remove(os.path.join(self.dir, f'ckpt-{n}.index'))
    with self.assertRaisesRegex(checkpoints.CheckpointError,
                                'no usable checkpoint in .*: ckpt-3: .*'
                                'ckpt-3.index is missing; ckpt-2: '):
      self._Restore()

  def testAnotherModelRaisesWithoutFallback(self):
    self._SaveThree()
    with self.assertRaisesRegex(
        checkpoints.IncompatibleCheckpointError,
        r'holds a run of X; its variables differ from this model.s: '
        r'model/layers/dense.1/w: shape \[4, 2\] here, \[3, 2\] in the '
        r'checkpoint\. Use a new --logdir'):
      self._Restore(_Model(shape=(4, 2)))
    self.assertEqual(self.log, [])

  def testStateFileDamageAndRepair(self):
    self._SaveThree()
    state = os.path.join(self.dir, checkpoints.STATE_FILE)
    for content in ('', 'model_checkpoint_path: ckpt-3 {{ garbage'):
      with open(state, 'w') as f:
        f.write(content)
      self.assertEqual(checkpoints.Candidates(self.dir, self.log.append),
                       [3, 2, 1])
      self.assertIn('damaged', self.log[-1])
      self.assertTrue(checkpoints.RepairStateFile(self.dir, self.log.append))
      with open(state + '.bad') as f:
        self.assertEqual(f.read(), content)
      self.assertEqual(tf.train.get_checkpoint_state(
          self.dir).all_model_checkpoint_paths,
                       [os.path.join(self.dir, f'ckpt-{n}') for n in (1, 2, 3)])
      self.assertFalse(checkpoints.RepairStateFile(self.dir, self.log.append))

  def testCandidatesJoinTheStateFileAndTheFiles(self):
    self._SaveThree()
    # ckpt-4 written but the state file not yet updated (killed in between).
    for name in os.listdir(self.dir):
      if name.startswith('ckpt-3.'):
        shutil.copy(os.path.join(self.dir, name),
                    os.path.join(self.dir, name.replace('ckpt-3', 'ckpt-4')))
    self.assertEqual(checkpoints.Candidates(self.dir, self.log.append),
                     [4, 3, 2, 1])

  def testCleanUpRemovesOnlyLeftoversOfKilledSaves(self):
    self._SaveThree()
    before = sorted(os.listdir(self.dir))
    os.makedirs(os.path.join(self.dir, 'ckpt-4_temp'))
    for name in ('ckpt-4_temp/part-00000-of-00001.index',
                 'checkpoint.tmp5f3a', 'ckpt-4.index.tempstate123'):
      with open(os.path.join(self.dir, name), 'w') as f:
        f.write('x')
    removed = checkpoints.CleanUp(self.dir, self.log.append)
    self.assertEqual(sorted(removed), ['checkpoint.tmp5f3a', 'ckpt-4.index.'
                                       'tempstate123', 'ckpt-4_temp'])
    self.assertEqual(sorted(os.listdir(self.dir)), before)
    self.assertEqual(self._Restore()[2], 3)
    self.assertEqual(checkpoints.CleanUp(self.dir, self.log.append), [])

  def testCheckpointNumber(self):
    for name, n in (('ckpt-12', 12), ('/a/ckpt-3.index', 3),
                    ('ckpt-7.data-00000-of-00001', 7), ('ckpt-7_temp', None),
                    ('checkpoint', None), ('ckpt-x', None)):
      self.assertEqual(checkpoints.CheckpointNumber(name), n, name)


if __name__ == '__main__':
  tf.test.main()
