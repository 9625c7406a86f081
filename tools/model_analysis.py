"""Prints parameters, FLOPs, memory and the partition plan of a built-in model.

Everything is computed from layer Params (tensorpipe/model_analysis.py): no
variable is created, so billion-parameter models are analysed in seconds.

  python -m tools.model_analysis --model=amoebanet_d --L=6 --F=208 \
      --num_partitions=4 --num_micro_batches=16
  python -m tools.model_analysis --model=transformer --L=64 --H=16384 --A=32 \
      --vocab=64000 --head_dim=64 --num_partitions=8 --num_micro_batches=32
  python -m tools.model_analysis --model=paper_transformers   # the table
  bazel run //tools:model_analysis -- --model=resnet101 --num_partitions=4
  python -m tools.model_analysis --model=amoebanet_d --L=6 --F=208 \
      --num_partitions=4 --num_micro_batches=16 --num_replicas=2,8 \
      --device_tflops=100 --link_gbps=100

--num_replicas adds the R x K plan: R data-parallel replicas, each the
K-partition pipeline of --batch_size examples, stage k's gradients ring
all-reduced among the R replicas over a link of --link_gbps (one per stage
unless --shared_link), devices achieving --device_tflops: step time, the
all-reduce time it adds, throughput and scaling efficiency for each R
(tensorpipe/scale_out.py's PlanScaleOut).

Models: transformer (T(L, H, A) translation, model dim --D, heads of
--head_dim), transformer_lm (decoder-only), paper_transformers (the paper's
four T(L, H, A) sizes at D 1024 and a 64k vocabulary: our parameter counts
next to the paper's, with --head_dim, default 64, and --shared_embeddings),
amoebanet_d / amoebanet_b (AmoebaNet(L, F)), resnet50 / resnet101 /
resnet152, consistency (the paper's 3x3 conv stack, --L convs).
"""

from typing import Any, List, Optional, Tuple

from absl import app
from absl import flags

from models import amoebanet
from models import consistency_cnn
from models import resnet
from models import transformer
from tensorpipe import model_analysis
from tensorpipe import scale_out
from tensorpipe import schedule_auto
from tensorpipe import schedule_plan

MODELS = ('transformer', 'transformer_lm', 'paper_transformers',
          'amoebanet_d', 'amoebanet_b', 'resnet50', 'resnet101', 'resnet152',
          'consistency')

# Defaults that depend on the model (used where a flag is left unset).
_DEFAULT_L = {'transformer': 6, 'transformer_lm': 6, 'amoebanet_d': 6,
              'amoebanet_b': 6, 'consistency': 16}
_DEFAULT_IMAGE_SIZE = {'consistency': 8}


def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines this tool's flags (called by the binary, or by tests on their
  own FlagValues so that importing the module defines no flags)."""
  fv = flag_values
  flags.DEFINE_enum('model', 'transformer', MODELS, 'Model to analyse.',
                    flag_values=fv)
  flags.DEFINE_integer('L', None, 'Transformer: encoder (= decoder) layers; '
                       'AmoebaNet: normal cells per stage; consistency: conv '
                       'layers. Default 6 (16 for consistency).',
                       flag_values=fv)
  flags.DEFINE_integer('H', 4096, 'Transformer feed-forward hidden size.',
                       flag_values=fv)
  flags.DEFINE_integer('A', 16, 'Transformer attention heads.',
                       flag_values=fv)
  flags.DEFINE_integer('D', 1024, 'Transformer model dimension (1024 = '
                       'Transformer-Big).', flag_values=fv)
  flags.DEFINE_integer('head_dim', None, 'Transformer: dimension of each '
                       'attention head (width A x head_dim); unset: D / A, '
                       'except for paper_transformers (64).', flag_values=fv)
  flags.DEFINE_integer('vocab', 32000, 'Transformer vocabulary size.',
                       flag_values=fv)
  flags.DEFINE_integer('seq_len', 256, 'Transformer source and target (or LM) '
                       'sequence length.', flag_values=fv)
  flags.DEFINE_bool('shared_embeddings', True, 'Transformer: share source and '
                    'target embeddings.', flag_values=fv)
  flags.DEFINE_bool('pre_layer_norm', False, 'Transformer: pre-LN residuals.',
                    flag_values=fv)
  flags.DEFINE_integer('F', 208, 'AmoebaNet filters of the first normal '
                       'cells.', flag_values=fv)
  flags.DEFINE_integer('image_size', None, 'Image height = width (default 224; '
                       '8 for consistency).', flag_values=fv)
  flags.DEFINE_integer('num_classes', 1000, 'Image models: classes.',
                       flag_values=fv)
  flags.DEFINE_bool('small_stem', False, 'Image models: the stem for 32x32 / '
                    '28x28 inputs.', flag_values=fv)
  flags.DEFINE_integer('batch_size', 64, 'Mini-batch size N (per replica in '
                       'the --num_replicas plan).', flag_values=fv)
  flags.DEFINE_integer('num_partitions', 1, 'K.', flag_values=fv)
  flags.DEFINE_integer('num_micro_batches', 1, 'T (must divide batch_size).',
                       flag_values=fv)
  flags.DEFINE_enum('optimizer', 'adam', ['sgd', 'momentum', 'rmsprop', 'adam',
                                          'adafactor'],
                    'Optimizer whose state is counted.', flag_values=fv)
  flags.DEFINE_enum('grad_sum', 'sequential', ['sequential', 'pairwise'],
                    "The pipeline's grad_sum: 'pairwise' keeps T.bit_length() "
                    'gradient buffers per weight instead of one.',
                    flag_values=fv)
  flags.DEFINE_string('param_dtype', 'float32', 'Dtype of weights, gradients '
                      'and optimizer state.', flag_values=fv)
  flags.DEFINE_string('activation_dtype', 'float32', 'Dtype of activations.',
                      flag_values=fv)
  flags.DEFINE_enum('partition_method', 'min_max', ['min_max', 'min_variance'],
                    'Partitioning objective.', flag_values=fv)
  flags.DEFINE_integer('max_layer_rows', 0, 'Print at most this many layer '
                       'rows (0 = all).', flag_values=fv)
  flags.DEFINE_list('num_replicas', [], 'R values of an R x K data-parallel '
                    'plan, e.g. 2,8 (R = 1 is added as the baseline); empty: '
                    'no plan.', flag_values=fv)
  flags.DEFINE_float('device_tflops', 100.0, 'Plan: TFLOP/s each stage '
                     'device achieves, not its peak (100 is about a third of '
                     "an A100's bf16 peak).", flag_values=fv)
  flags.DEFINE_float('link_gbps', 100.0, "Plan: Gbit/s of each stage's link "
                     'to the other replicas (100 GbE or EDR InfiniBand per '
                     'accelerator).', flag_values=fv)
  flags.DEFINE_float('link_latency_us', 10.0, 'Plan: per-message latency of '
                     'the ring all-reduce, in microseconds.', flag_values=fv)
  flags.DEFINE_bool('shared_link', False, "Plan: a replica's K stages share "
                    'one link (one NIC per host) instead of one each.',
                    flag_values=fv)
  flags.DEFINE_bool('recompute', True, 'Plan: the backward recomputes the '
                    'forward (TensorPipeLayer default).', flag_values=fv)
  flags.DEFINE_list('schedules', [], "Schedules to predict side by side "
                    "(step, bubble, memory peak): 'all', or names from "
                    'gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_v '
                    '(schedule_plan.ALL; interleaved_1f1b and zb_v with 2 '
                    'stages per device); uses --recompute and '
                    '--device_tflops.', flag_values=fv)
  flags.DEFINE_bool('plan', False, "Rank the schedules as schedule='auto' "
                    'does (tensorpipe/schedule_auto.py): predicted step, '
                    'work, ticks and memory peak; uses --recompute, '
                    '--plan_profile, --plan_regime, --plan_memory_budget_mib.',
                    flag_values=fv)
  flags.DEFINE_string('plan_profile', None, 'With --plan: a profile.json of '
                      'tools/benchmark --profile (measured costs); unset: '
                      'FLOP-based costs.', flag_values=fv)
  flags.DEFINE_enum('plan_regime', 'shared', ['shared', 'separate'], 'With '
                    "--plan: 'shared' (logical devices of one process share "
                    "its thread pools) or 'separate' (own executors).",
                    flag_values=fv)
  flags.DEFINE_float('plan_memory_budget_mib', None, 'With --plan: most MiB '
                     'of activations per device; unset: no limit.',
                     flag_values=fv)
  flags.DEFINE_bool('plan_recompute_auto', False, "With --plan: rank with "
                    "and without recompute (recompute='auto'; rows without "
                    "it marked 'norc') instead of --recompute only.",
                    flag_values=fv)


def ModelSpec(model: str, L: Optional[int] = None, H: int = 4096,
              A: int = 16, D: int = 1024, vocab: int = 32000,
              seq_len: int = 256, shared_embeddings: bool = True,
              pre_layer_norm: bool = False, F: int = 208,
              image_size: Optional[int] = None, num_classes: int = 1000,
              small_stem: bool = False,
              batch_size: int = 64,
              head_dim: Optional[int] = None
              ) -> Tuple[List[Any], List[Any], str]:
  """Layer Params, input shapes and a title of a built-in model.

  Raises:
    ValueError: for an unknown model name.
  """
  if model not in MODELS or model == 'paper_transformers':
    raise ValueError(f'unknown model {model!r}; use one of '
                     f'{[m for m in MODELS if m != "paper_transformers"]} '
                     '(paper_transformers is a table: PaperTransformerTable)')
  if L is None:
    L = _DEFAULT_L.get(model)
  if image_size is None:
    image_size = _DEFAULT_IMAGE_SIZE.get(model, 224)
  images = [[batch_size, image_size, image_size, 3]]
  if model == 'transformer':
    layers = transformer.TransformerLayers(
        L, H, A, model_dim=D, vocab_size=vocab, max_len=seq_len,
        pre_layer_norm=pre_layer_norm, shared_embeddings=shared_embeddings,
        head_dim=head_dim)
    width = A * head_dim if head_dim else D
    return (layers, transformer.TranslationInputShapes(batch_size, seq_len,
                                                       seq_len),
            f'Transformer T({L}, {H}, {A}), model dim {D}, attention width '
            f'{width}, vocabulary {vocab}')
  if model == 'transformer_lm':
    layers = transformer.TransformerLmLayers(
        L, H, A, model_dim=D, vocab_size=vocab, max_len=seq_len,
        pre_layer_norm=pre_layer_norm, head_dim=head_dim)
    return (layers, transformer.LmInputShapes(batch_size, seq_len),
            f'Transformer LM ({L} decoder layers, H={H}, A={A}), model dim '
            f'{D}, vocabulary {vocab}')
  if model.startswith('amoebanet'):
    variant = model[-1].upper()
    layers = amoebanet.AmoebaNetLayers(
        variant, num_normal_cells=L, num_filters=F, num_classes=num_classes,
        image_size=image_size, small_stem=small_stem)
    return layers, images, (f'AmoebaNet-{variant}({L}, {F}), {image_size}x'
                            f'{image_size}, {num_classes} classes')
  if model.startswith('resnet'):
    depth = int(model[len('resnet'):])
    layers = resnet.ResNetLayers(depth, num_classes,
                                 input_shape=(None, image_size, image_size, 3),
                                 small_stem=small_stem)
    return layers, images, (f'ResNet-{depth}, {image_size}x{image_size}, '
                            f'{num_classes} classes')
  layers = consistency_cnn.ConsistencyLayers(L)
  return (layers, [[batch_size, image_size, image_size, 1]],
          f'consistency CNN: {L} Conv2DLayers 3x3x1x1')


def PaperTransformerCounts(head_dim: Optional[int] = transformer.PAPER_HEAD_DIM,
                           shared_embeddings: bool = True
                           ) -> List[Tuple[str, int, float]]:
  """[(name, our parameter count, the paper's)] of the paper's Transformers.

  Counted from Params with FPropMeta (no variable is created).
  """
  rows = []
  for name, t in transformer.PAPER_TRANSFORMERS.items():
    layers = transformer.PaperTransformerLayers(
        name, head_dim=head_dim, shared_embeddings=shared_embeddings,
        max_len=256)
    report = model_analysis.AnalyzeLayers(
        layers, transformer.TranslationInputShapes(1, 256, 256),
        exact_optimizer_state=False)
    rows.append((name, report.num_params, t.paper_params))
  return rows


def PaperTransformerTable(head_dim: Optional[int] = transformer.PAPER_HEAD_DIM,
                          shared_embeddings: bool = True) -> str:
  """The printed table of PaperTransformerCounts."""
  width = '64 x A' if head_dim == 64 else (
      f'{head_dim} x A' if head_dim else 'D = 1024')
  lines = [f"The paper's Transformers: model dim {transformer.PAPER_MODEL_DIM},"
           f' vocabulary {transformer.PAPER_VOCAB_SIZE}, attention width '
           f'{width}, {"shared" if shared_embeddings else "separate"} '
           'source / target embedding, separate softmax',
           f'{"model":<18} {"ours":>15} {"paper":>8} {"ours/paper":>11}']
  for name, ours, paper in PaperTransformerCounts(head_dim, shared_embeddings):
    paper_text = (f'{paper / 1e9:g}B' if paper >= 1e9 else
                  f'{paper / 1e6:g}M')
    lines.append(f'{name:<18} {ours:>15,} {paper_text:>8} '
                 f'{ours / paper - 1:>+10.1%}')
  return '\n'.join(lines)


def Run(fv: flags.FlagValues) -> str:
  """Builds the model named by the flags and returns the printed report."""
  if fv.model == 'paper_transformers':
    head_dim = transformer.PAPER_HEAD_DIM if fv.head_dim is None else (
        fv.head_dim or None)
    return PaperTransformerTable(head_dim, fv.shared_embeddings)
  layers, input_shapes, title = ModelSpec(
      fv.model, L=fv.L, H=fv.H, A=fv.A, D=fv.D, vocab=fv.vocab,
      seq_len=fv.seq_len, shared_embeddings=fv.shared_embeddings,
      pre_layer_norm=fv.pre_layer_norm, F=fv.F, image_size=fv.image_size,
      num_classes=fv.num_classes, small_stem=fv.small_stem,
      batch_size=fv.batch_size, head_dim=fv.head_dim)
  report = model_analysis.AnalyzeLayers(
      layers, input_shapes, num_partitions=fv.num_partitions,
      num_micro_batches=fv.num_micro_batches, optimizer=fv.optimizer,
      param_dtype=fv.param_dtype, activation_dtype=fv.activation_dtype,
      method=fv.partition_method, grad_sum_mode=fv.grad_sum)
  text = title + '\n' + report.ToText(max_layer_rows=fv.max_layer_rows or None)
  if fv.schedules:
    rows = schedule_plan.CompareSchedules(
        report, _Schedules(fv.schedules), recompute=fv.recompute,
        device_flops=fv.device_tflops * 1e12)
    text += '\n\n' + schedule_plan.CompareText(
        rows, fv.num_partitions, fv.num_micro_batches, fv.recompute)
  if fv.plan:
    text += '\n\n' + _PlanText(report, fv)
  if fv.num_replicas:
    replicas = _PositiveInts('num_replicas', fv.num_replicas)
    assumptions = scale_out.ScaleOutAssumptions(
        device_flops=fv.device_tflops * 1e12,
        link_bytes_per_s=fv.link_gbps * 1e9 / 8,
        link_latency_s=fv.link_latency_us * 1e-6,
        shared_link=fv.shared_link, recompute=fv.recompute)
    plan = scale_out.PlanScaleOut(report, replicas, assumptions)
    text += '\n\n' + plan.ToText()
  return text


def _PlanText(report: model_analysis.Report, fv: flags.FlagValues) -> str:
  """--plan: schedule_auto's ranking of the analysed model."""
  budget = fv.plan_memory_budget_mib
  profile = schedule_auto.ProfileFor(report, fv.plan_profile)
  plan = schedule_auto.RankOverT(
      report, lambda _: profile, [report.num_micro_batches],
      [True, False] if fv.plan_recompute_auto else fv.recompute,
      fv.plan_regime, schedule_plan.ALL,
      budget * 2**20 if budget is not None else None,
      # A measured profile cuts on its cells, as schedule='auto' does.
      schedule_auto.CutCosts)
  note = ('' if fv.plan_profile else '\nFLOP-based costs (t_B = 2 t_F, '
          't_I = t_W, no tick cost): in the shared regime every schedule '
          'does the same work; give --plan_profile for measured costs.')
  return plan.Text() + note


def _Schedules(names: List[str]) -> List[Tuple[str, int]]:
  """--schedules as (name, stages per device) pairs."""
  if names == ['all']:
    return list(schedule_plan.ALL)
  known = dict(schedule_plan.ALL)
  bad = [n for n in names if n not in known]
  if bad:
    raise ValueError(f'--schedules={",".join(names)}: {bad[0]!r} is not one '
                     f'of {sorted(known)}; use all or a comma-separated list')
  return [(n, known[n]) for n in names]


def _PositiveInts(name: str, values: List[str]) -> List[int]:
  try:
    ints = [int(v) for v in values]
  except ValueError:
    ints = []
  if not ints or any(i < 1 for i in ints):
    raise ValueError(f'--{name}={",".join(values)} must be positive integers '
                     'separated by commas, e.g. 2,8')
  return ints


def main(argv, flag_values: Optional[flags.FlagValues] = None):
  """Prints the report; flag_values defaults to the parsed global FLAGS."""
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; use flags')
  try:
    print(Run(flags.FLAGS if flag_values is None else flag_values))
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from None


if __name__ == '__main__':
  DefineFlags()
  app.run(main)
