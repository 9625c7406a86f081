"""English-Spanish Bible translation with a small pipelined Transformer.

Data: the KJV / Reina-Valera 1909 SWORD modules (Debian sword-text-kjv,
sword-text-sparv), prepared by `bash tools/prepare_data.sh` into TFDS
`bible_parallel` (tensorpipe/inputs/translation_input.py); a SentencePiece
vocabulary built from the training split; a target-language token starts
each target. Training recipe after GPipe's Transformers: Adafactor with
momentum and update clipping 1.0, linear warm-up then inverse square root
decay, label smoothing 0.1. Evaluation reports BLEU (sacrebleu) of greedy
decodes on the test split.
"""

from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import model_registry
from tensorpipe import optimizers
from tensorpipe import tasks


class _BibleBase(base_experiment.BaseExperiment):
  """T(L, H, A) on Bible pairs; the directions are the class constant."""

  DIRECTIONS = ['en->es']
  VOCAB_SIZE = 8000
  MAX_LEN = 64             # source and target pieces per sentence
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 64
  NUM_LAYERS = 2           # L: encoder layers (and as many decoder layers)
  MODEL_DIM = 256
  HIDDEN_DIM = 1024        # H
  NUM_HEADS = 4            # A
  DROPOUT = 0.1
  LABEL_SMOOTHING = 0.1
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  PEAK_LEARNING_RATE = 3e-3
  WARMUP_STEPS = 500
  MAX_STEPS = 4000
  EVAL_STEPS = 8           # eval batches (BLEU decoding is the slow part)
  DATA_DIR = None
  FPROP_DTYPE = None        # e.g. tf.bfloat16 activations (weights float32)

  def _Input(self, split, batch_size):
    from tensorpipe.inputs import translation_input  # pylint: disable=g-import-not-at-top
    return translation_input.BibleTranslationInput.Params().Set(
        name=split, split=split, batch_size=batch_size,
        directions=list(self.DIRECTIONS), vocab_size=self.VOCAB_SIZE,
        max_src_len=self.MAX_LEN, max_tgt_len=self.MAX_LEN,
        data_dir=self.DATA_DIR)

  def Train(self):
    return self._Input('train', self.BATCH_SIZE)

  def Test(self):
    return self._Input('test', self.EVAL_BATCH_SIZE)

  def Task(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    model = transformer.TransformerPipeline(
        self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES, self.BATCH_SIZE,
        self.MAX_LEN, self.MAX_LEN, num_layers=self.NUM_LAYERS,
        hidden_dim=self.HIDDEN_DIM, num_heads=self.NUM_HEADS,
        model_dim=self.MODEL_DIM, vocab_size=self.VOCAB_SIZE,
        max_len=self.MAX_LEN, label_smoothing=self.LABEL_SMOOTHING,
        dropout=self.DROPOUT)
    p = tasks.SequenceTask.Params().Set(name='task', model=model,
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


@model_registry.RegisterSingleTaskModel
class TransformerEnEs4x8(_BibleBase):
  """English (KJV) -> Spanish (RV 1909), K=4, T=8."""
  DIRECTIONS = ['en->es']


@model_registry.RegisterSingleTaskModel
class TransformerEsEn4x8(_BibleBase):
  """Spanish -> English, K=4, T=8."""
  DIRECTIONS = ['es->en']


@model_registry.RegisterSingleTaskModel
class TransformerMulti4x8(_BibleBase):
  """en->es and es->en in one model, temperature-sampled (T=5)."""
  DIRECTIONS = ['en->es', 'es->en']
