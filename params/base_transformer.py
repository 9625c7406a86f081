"""Shared recipe of the Transformer experiments (not registered itself).

After GPipe's Transformers (Huang et al. 2018, section 4): Adafactor with
momentum (beta1 0.9) and update clipping 1.0, a linear warm-up to the peak
learning rate and then inverse square root decay. The subclasses in
params/nmt/bible.py (translation) and params/lm/brown.py (language model)
give the input and the model.
"""

from tensorpipe import base_experiment
from tensorpipe import hyperparams
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import tasks


class TransformerExperiment(base_experiment.BaseExperiment):
  """A pipelined Transformer on a SentencePiece input; knobs are constants.

  Subclasses implement `_Input(split, batch_size)` and `Model()`.
  """

  VOCAB_SIZE = 8000
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 64
  NUM_LAYERS = 2           # L (decoder layers; encoder layers as many)
  MODEL_DIM = 256
  HIDDEN_DIM = 1024        # H
  NUM_HEADS = 4            # A
  HEAD_DIM = None          # per-head dimension; None: MODEL_DIM / NUM_HEADS
                           # (the paper-size presets use 64)
  SHARED_EMBEDDINGS = True  # translation: one source / target table
  DROPOUT = 0.1
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  PEAK_LEARNING_RATE = 3e-3
  WARMUP_STEPS = 500
  MAX_STEPS = 4000
  EVAL_STEPS = None        # eval batches; None reads the whole split
  DATA_DIR = None          # None: tfds_utils' default (data/tfds)
  FPROP_DTYPE = None       # e.g. tf.bfloat16 activations (weights float32)

  def _Input(self, split: str,
             batch_size: int) -> hyperparams.InstantiableParams:
    """Params of the input of `split` with `batch_size` examples a batch."""
    raise NotImplementedError(f'{type(self).__name__}._Input')

  def Model(self) -> hyperparams.InstantiableParams:
    """Params of the pipelined model (models/transformer.py)."""
    raise NotImplementedError(f'{type(self).__name__}.Model')

  def Train(self):
    return self._Input('train', self.BATCH_SIZE)

  def Test(self):
    return self._Input('test', self.EVAL_BATCH_SIZE)

  def Task(self):
    p = tasks.SequenceTask.Params().Set(name='task', model=self.Model(),
                                        vocab_size=self.VOCAB_SIZE,
                                        fprop_dtype=self.FPROP_DTYPE)
    tp = p.train
    tp.optimizer = optimizers.Adafactor.Params().Set(
        beta1=0.9, clipping_threshold=1.0)
    tp.lr_schedule = lr_schedules.WarmupRsqrtDecay.Params().Set(
        peak=self.PEAK_LEARNING_RATE, warmup_steps=self.WARMUP_STEPS)
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = 500
    tp.summary_interval_steps = 50
    tp.log_interval_steps = 50
    tp.eval_steps = self.EVAL_STEPS
    return p
