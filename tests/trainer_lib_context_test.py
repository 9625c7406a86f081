"""Tests that trainer_lib's train step sets the FProp context from the step."""

import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import base_layer
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import linear
from tensorpipe.layers import pooling

test_utils.ConfigureTestDevices()

# (step seed, drop-path progress) seen by every training-mode call of
# _ContextProbe (eval calls, e.g. an evaluation the trainer runs, are left out).
_SEEN = []


class _ContextProbe(base_layer.BaseLayer):
  """Identity that records the step seed and drop-path progress it runs with,
  in the forward pass and in the pipeline's recompute."""

  def FProp(self, theta, x):
    del theta  # no weights
    ctx = py_utils.Current()

    training = py_utils.IsTraining()

    def Record(seed, progress):
      if training:
        _SEEN.append((int(seed), float(progress)))
      return 0.0
    record = tf.py_function(
        Record, [tf.cast(ctx.step_seed, tf.int64),
                 tf.cast(py_utils.CurrentDropPathProgress(), tf.float32)],
        tf.float32)
    record.set_shape([])
    return x + tf.cast(record, x.dtype) * 0


class _Probed(base_experiment.BaseExperiment):
  """The probe, pooling and FC, K=2 with recompute, on 8x8 images."""

  MAX_STEPS = 4

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=4, num_examples=16)

  def Test(self):
    return self.Train().Set(name='test', split='test')

  def Task(self):
    model = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', num_micro_batches=2, partitions=[
            [_ContextProbe.Params().Set(name='probe0'),
             pooling.GlobalPoolingLayer.Params().Set(name='gap')],
            [_ContextProbe.Params().Set(name='probe1'),
             linear.FCLayer.Params().Set(name='logits', input_dim=1,
                                         output_dim=4, activation='NONE')]])
    p = tasks.ClassificationTask.Params().Set(name='task', model=model,
                                              num_classes=4)
    tp = p.train
    tp.optimizer = optimizers.SGD.Params()
    tp.lr_schedule = lr_schedules.Constant.Params().Set(value=0.1)
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = 100
    tp.summary_interval_steps = 100
    tp.log_interval_steps = 100
    return p


class TrainerContextTest(tf.test.TestCase):

  def testTrainStepSetsDropPathProgressToStepOverMaxSteps(self):
    del _SEEN[:]
    trainer = trainer_lib.Trainer(_Probed().ModelParams(), self.get_temp_dir(),
                                  log_fn=lambda _: None)
    trainer.Train()
    steps = _Probed.MAX_STEPS
    self.assertEqual(sorted({seed for seed, _ in _SEEN}), list(range(steps)))
    # Every call of step s, the recompute included (2 probes x 2
    # micro-batches, forward and recompute for partition 0's and 1's
    # probes), sees progress s / max_steps: 0 at the first step.
    for seed, progress in _SEEN:
      self.assertAllClose(progress, seed / steps, msg=f'step {seed}')
    per_step = [sum(1 for s, _ in _SEEN if s == step) for step in range(steps)]
    self.assertEqual(per_step, [8] * steps)


if __name__ == '__main__':
  tf.test.main()
