"""The experiments test, shared by experiments_test.py and
experiments_slow_test.py: every registered experiment builds and runs one
training step, tiny.

AmoebaNet experiments take minutes to trace their one step on this CPU, and
some variants have the model of another experiment (K=1 twins, other
translation directions): the fast test only builds those (model, optimizer,
inputs), and the slow test runs the step of the twins and of one AmoebaNet
experiment per code path (D with the small stem, B with the small stem and
aux head, B with the ImageNet stem). The transfer-set experiments are the
ImageNet-stem class with other constants (classes, learning rate, weight
decay, input), so they are built but not stepped, to keep the slow suite
within CI's time. Each experiment is shrunk through its UPPER_CASE knobs (a
subclass) and fed a synthetic input with the batch keys and shapes of its
real input; its real input Params are built too, and reading them without
prepared data must fail with the command that prepares the data.

Budget variants (the *Short / *Medium runs of results/, and experiments that
differ only in their real input, such as the translation directions) have the
task of another experiment, training Params aside, and are fed the same
synthetic input: the fast test steps one experiment per distinct task
(TaskSignature) and builds the others.
"""

import os
import tempfile

import tensorflow as tf

from tensorpipe import model_registry
from tensorpipe import synthetic_input
from tensorpipe import test_utils
from tensorpipe import trainer_lib

test_utils.ConfigureTestDevices()

_TINY = {
    # knob: tiny value, applied when the experiment class has the knob.
    'BATCH_SIZE': 4, 'EVAL_BATCH_SIZE': 4, 'NUM_MICRO_BATCHES': 2,
    'NUM_PARTITIONS': 2, 'FILTERS': 2, 'NUM_FILTERS': 8,
    'NUM_NORMAL_CELLS': 1, 'IMAGE_SIZE': 16, 'STEM_FILTERS': 4,
    'NUM_LAYERS': 1, 'MODEL_DIM': 8, 'HIDDEN_DIM': 16, 'NUM_HEADS': 2,
    'VOCAB_SIZE': 16, 'MAX_LEN': 6, 'SEQ_LEN': 6,
}


def _Tiny(cls):
  knobs = {k: v for k, v in _TINY.items() if hasattr(cls, k)}
  if getattr(cls, 'NUM_PARTITIONS', 1) == 1:
    knobs['NUM_PARTITIONS'] = 1  # keep the K=1 variants unpipelined
  if cls.__module__ == 'params.consistency':
    knobs['NUM_LAYERS'] = 4
  if hasattr(cls, 'AUX_HEAD') and not getattr(cls, 'SMALL_STEM', True):
    knobs['AUX_HEAD'] = False  # 16x16 images are too small for it
  return type(cls.__name__ + 'Tiny', (cls,), knobs)()


def _SyntheticLike(input_p, exp):
  """A synthetic input with the keys and shapes of `input_p`."""
  name = input_p.cls.__name__
  common = dict(name=input_p.name, split=input_p.split,
                batch_size=input_p.batch_size, num_examples=16,
                shuffle_buffer=0)
  if 'Translation' in name or 'Lm' in name:
    length = getattr(exp, 'MAX_LEN', None) or exp.SEQ_LEN
    return synthetic_input.SyntheticSequenceInput.Params().Set(
        task='nmt' if 'Translation' in name else 'lm',
        vocab_size=exp.VOCAB_SIZE, max_length=length, **common)
  if name.startswith('Synthetic'):
    return input_p.Copy().Set(num_examples=16)
  from tensorpipe.inputs import image_inputs  # pylint: disable=g-import-not-at-top
  defaults = image_inputs.DATASETS.get(input_p.dataset_name, {})
  size = tuple(input_p.image_size or defaults['image_size'])
  channels = len(input_p.mean or defaults['mean'])
  return synthetic_input.SyntheticImageInput.Params().Set(
      image_shape=size + (channels,), num_classes=exp.NUM_CLASSES
      if hasattr(exp, 'NUM_CLASSES') else 10, **common)


# Same model code as an experiment whose step runs in the fast test.
_TWINS = ('consistency.Consistency1x8', 'image.fashion_mnist.ResNet1x8',
          'lm.brown.TransformerLm1x8', 'lm.brown.KerasGpt2Lm1x8',
          'nmt.bible.TransformerEsEn4x8',
          'nmt.bible.TransformerMulti4x8',
          'nmt.bible.TransformerMultiLowProportional4x8')


# One AmoebaNet experiment per code path.
_AMOEBANET_STEPPED = ('image.fashion_mnist.AmoebaNetD4x8',
                      'image.cifar10.AmoebaNetB4x8',
                      'image.imagenet.AmoebaNetB4x8')


def IsSlow(key: str) -> bool:
  return 'AmoebaNet' in key or key in _TWINS


def TaskSignature(task_p) -> str:
  """The task's Params text without its training budget and schedule."""
  return '\n'.join(line for line in task_p.ToText().splitlines()
                   if not line.startswith('train.'))


def RunsStepWhenSlow(key: str) -> bool:
  return key in _TWINS or key in _AMOEBANET_STEPPED


class ExperimentStepsMixin:
  """The test; RUN_SLOW = True steps the experiments IsSlow leaves out."""

  RUN_SLOW = False

  def testEveryExperimentRunsOneStep(self):
    keys = model_registry.ListKeys()
    self.assertGreaterEqual(len(keys), 15)
    self.assertTrue(set(_TWINS + _AMOEBANET_STEPPED) <= set(keys))
    empty_data_dir = tempfile.mkdtemp()
    stepped = {}  # TaskSignature -> key
    for key in keys:
      if self.RUN_SLOW and not RunsStepWhenSlow(key):
        continue
      if not self.RUN_SLOW and IsSlow(key):
        self._BuildOnly(key)
        continue
      with self.subTest(key=key):
        exp = _Tiny(model_registry.GetClass(key))
        p = exp.ModelParams()
        signature = TaskSignature(p.task)
        if not self.RUN_SLOW and signature in stepped:
          self._BuildOnly(key)  # the same task as stepped[signature]
          self._CheckRealInput(key, p.input.Copy(), empty_data_dir)
          continue
        stepped[signature] = key
        real_input = p.input.Copy()
        p.input = _SyntheticLike(p.input, exp)
        p.eval_input = _SyntheticLike(p.eval_input, exp)
        logdir = os.path.join(self.get_temp_dir(), key)
        trainer = trainer_lib.Trainer(p, logdir, log_fn=lambda _: None)
        batch = next(iter(trainer.TrainInput().Dataset()))
        out = trainer.TrainStep(batch)
        self.assertTrue(bool(tf.math.is_finite(out['loss'])), key)
        self.assertEqual(int(trainer.global_step.numpy()), 1)
        self._CheckRealInput(key, real_input, empty_data_dir)

  def _BuildOnly(self, key):
    exp = _Tiny(model_registry.GetClass(key))
    p = exp.ModelParams()
    p.input = _SyntheticLike(p.input, exp)
    p.eval_input = _SyntheticLike(p.eval_input, exp)
    trainer = trainer_lib.Trainer(p, os.path.join(self.get_temp_dir(), key),
                                  log_fn=lambda _: None)
    self.assertNotEmpty(trainer.task.trainable_variables)

  def _CheckRealInput(self, key, input_p, data_dir):
    if input_p.cls.__name__.startswith('Synthetic'):
      return
    input_p.data_dir = data_dir
    try:
      inp = input_p.Instantiate()
      inp.Dataset()
    except ValueError as e:  # a data set TFDS has no builder for
      self.assertIn('builder', str(e), key)
      return
    except FileNotFoundError as e:
      self.assertIn('To prepare it', str(e), key)
      return
    self.fail(f'{key}: reading unprepared data did not fail')
