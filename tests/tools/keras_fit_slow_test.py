"""The Keras CNN end to end on Fashion-MNIST: keras_fit and the trainer.

tools/keras_fit.py trains models/keras_models.py with TensorPipeModel.fit,
saves it (ModelCheckpoint), writes TensorBoard summaries and exports a
SavedModel; the model read back by keras.models.load_model and the SavedModel
run in a process that cannot import tensorpipe give the same predictions.
The registered experiment image.fashion_mnist.KerasCnn4x8 trains with
tools/trainer.py and resumes from its checkpoint (its params.txt holds the
Keras configs as text).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import keras_pipeline  # pylint: disable=unused-import
from tensorpipe import test_utils
from tests import export_testlib
from tests.tools import tool_testlib

test_utils.ConfigureTestDevices()


class KerasFitToolTest(tf.test.TestCase):

  def testFitSavesAndExportsTheSameModel(self):
    test_utils.CheckPrepared(self, 'fashion_mnist')
    tmp = self.get_temp_dir()
    logdir, export_dir = os.path.join(tmp, 'fit'), os.path.join(tmp, 'export')
    proc = tool_testlib.RunTool(
        'keras_fit', f'--logdir={logdir}', '--steps_per_epoch=3',
        '--eval_steps=2', '--batch_size=32', '--num_partitions=2',
        '--num_micro_batches=4', f'--export_dir={export_dir}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertRegex(proc.stdout, r'test: accuracy=0\.\d+, loss=\d')
    self.assertNotEmpty(tf.io.gfile.glob(os.path.join(logdir, 'train',
                                                      'events.*')))
    model = keras.models.load_model(os.path.join(logdir, 'model.keras'))
    self.assertLen(model.pipeline.PartitionLayers(), 2)
    # 37 rows: not a multiple of T=4 nor of the batch size.
    x = np.random.RandomState(0).normal(size=(37, 28, 28, 1)).astype(
        np.float32)
    expected = model.predict(x, batch_size=32, verbose=0)
    loaded = export_testlib.RunInCleanProcess(export_dir, [{'inputs': x}],
                                              tmp)
    self.assertEqual(loaded.modules, [])
    # One device chained vs padded micro-batches: float32 sums in another
    # order (test_utils.DEFAULT_RTOL).
    test_utils.AssertAllCloseScaled(
        self, loaded.outputs[0]['outputs'], expected,
        test_utils.DEFAULT_RTOL[tf.float32])


class KerasExperimentTrainerTest(tf.test.TestCase):

  def testTrainerTrainsAndResumesKerasCnn(self):
    test_utils.CheckPrepared(self, 'fashion_mnist')
    logdir = os.path.join(self.get_temp_dir(), 'trainer')
    common = ['--model=image.fashion_mnist.KerasCnn4x8', f'--logdir={logdir}',
              '--eval_steps=1', '--model_params_override=input.batch_size=32;'
              ' eval_input.batch_size=32']
    first = tool_testlib.RunTool('trainer', *common, '--max_steps=2')
    self.assertEqual(first.returncode, 0, first.stderr[-3000:])
    second = tool_testlib.RunTool('trainer', *common, '--max_steps=4')
    self.assertEqual(second.returncode, 0, second.stderr[-3000:])
    self.assertIn('from step 2 to 4', second.stderr)
    tensors = tool_testlib.CheckpointTensors(logdir, ('model/',))
    names = ' '.join(tensors)
    for key in ('conv1/kernel', 'bn5/moving_mean', 'logits/bias'):
      self.assertIn(key, names)
    with open(os.path.join(logdir, 'params.txt')) as f:
      self.assertIn("'class_name': 'Conv2D'", f.read())


if __name__ == '__main__':
  tf.test.main()
