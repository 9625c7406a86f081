"""English-Spanish Bible translation with a small pipelined Transformer.

Data: the KJV / Reina-Valera 1909 SWORD modules (Debian sword-text-kjv,
sword-text-sparv), prepared by `bash tools/prepare_data.sh` into TFDS
`bible_parallel` (tensorpipe/inputs/translation_input.py); a SentencePiece
vocabulary built from the training split; a target-language token starts
each target. Training recipe: params/base_transformer.py (GPipe's
Transformers), with label smoothing 0.1. Evaluation reports BLEU (sacrebleu)
of greedy decodes on the test split.
"""

from params import base_transformer
from tensorpipe import model_registry


class _BibleBase(base_transformer.TransformerExperiment):
  """T(L, H, A) on Bible pairs; the directions are the class constant."""

  DIRECTIONS = ['en->es']
  TEMPERATURE = 5.0        # sampling temperature of the directions
  DIRECTION_FRACTIONS = None  # training pairs kept per direction (None: all)
  MAX_LEN = 64             # source and target pieces per sentence
  LABEL_SMOOTHING = 0.1
  EVAL_STEPS = 8           # eval batches (BLEU decoding is the slow part)

  def _Input(self, split, batch_size):
    from tensorpipe.inputs import translation_input  # pylint: disable=g-import-not-at-top
    return translation_input.BibleTranslationInput.Params().Set(
        name=split, split=split, batch_size=batch_size,
        directions=list(self.DIRECTIONS), temperature=self.TEMPERATURE,
        direction_fractions=(None if self.DIRECTION_FRACTIONS is None else
                             list(self.DIRECTION_FRACTIONS)),
        vocab_size=self.VOCAB_SIZE,
        max_src_len=self.MAX_LEN, max_tgt_len=self.MAX_LEN,
        data_dir=self.DATA_DIR)

  def Task(self):
    from tensorpipe.inputs import vocab  # pylint: disable=g-import-not-at-top
    p = super().Task()
    p.decode_eos_id = vocab.EOS_ID  # greedy decoding stops after </s>
    return p

  def Model(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    return transformer.TransformerPipeline(
        self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES, self.BATCH_SIZE,
        self.MAX_LEN, self.MAX_LEN, num_layers=self.NUM_LAYERS,
        hidden_dim=self.HIDDEN_DIM, num_heads=self.NUM_HEADS,
        model_dim=self.MODEL_DIM, head_dim=self.HEAD_DIM,
        shared_embeddings=self.SHARED_EMBEDDINGS, vocab_size=self.VOCAB_SIZE,
        max_len=self.MAX_LEN, label_smoothing=self.LABEL_SMOOTHING,
        dropout=self.DROPOUT)


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


@model_registry.RegisterSingleTaskModel
class TransformerMultiLow4x8(TransformerMulti4x8):
  """en->es with all its pairs, es->en a low-resource direction (5% of its
  training pairs), T=5: unequal directions, so the temperature matters."""
  DIRECTION_FRACTIONS = [1.0, 0.05]


@model_registry.RegisterSingleTaskModel
class TransformerMultiLowProportional4x8(TransformerMultiLow4x8):
  """The same sampled in proportion to size (T=1)."""
  TEMPERATURE = 1.0


class _Short:
  """Mixin: a fixed reduced budget for results/ on the shared 2-core
  machine; BLEU on the whole test split; checkpoints every 50 steps."""
  MAX_STEPS = 100
  WARMUP_STEPS = 50
  EVAL_STEPS = None

  def Task(self):
    p = super().Task()
    p.train.save_interval_steps = 50
    p.train.summary_interval_steps = 10   # curves for results/
    p.train.log_interval_steps = 25
    return p


@model_registry.RegisterSingleTaskModel
class TransformerEnEsShort4x8(_Short, TransformerEnEs4x8):
  """en->es, K=4, T=8, 100 steps, BLEU on the whole test split."""


@model_registry.RegisterSingleTaskModel
class TransformerEnEsShort1x8(TransformerEnEsShort4x8):
  """The same unpipelined (K=1, T=8)."""
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class TransformerMultiLowShort4x8(_Short, TransformerMultiLow4x8):
  """TransformerMultiLow4x8 (T=5) on a reduced budget (400 steps: the
  low-resource direction needs more than 100 to learn anything); BLEU and
  loss per direction."""
  MAX_STEPS = 400
  WARMUP_STEPS = 100


@model_registry.RegisterSingleTaskModel
class TransformerMultiLowProportionalShort4x8(
    _Short, TransformerMultiLowProportional4x8):
  """TransformerMultiLowProportional4x8 (T=1) on the same budget."""
  MAX_STEPS = 400
  WARMUP_STEPS = 100


# The keys the runs in results/ were launched with (renamed to <Model><K>x<T>).
model_registry.RegisterAlias('TransformerEnEs4x8Short', TransformerEnEsShort4x8)
model_registry.RegisterAlias('TransformerEnEs1x8Short', TransformerEnEsShort1x8)
