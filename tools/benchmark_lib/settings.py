"""The benchmark's setting names and built-in models (pure Python, no TF).

A setting names one way of running a model's layers:

  plain          the layers as one SequentialLayer, no TensorPipeLayer;
  plain-T8       the same, run on 8 micro-batches one after another
                 (Python-unrolled in the step, gradients summed by autodiff,
                 all activations kept): what micro-batching itself costs
                 with these kernels, without any pipeline machinery;
  naive-K        K partitions, T=1, no recompute (model parallelism, no
                 pipelining), with the issue's "one core per device" threads
                 (one intra-op thread, K inter-op threads). TF's logical CPU
                 devices share one thread pool, so the idle devices' cores
                 still run the busy device's independent ops (e.g. the input
                 and weight gradients of a conv at the same time);
  naive-K-serial the same with a single inter-op thread: at most one op at a
                 time, as on K single-core devices of which model
                 parallelism keeps one busy at a time (the paper's naive
                 baseline). Compared across processes.
  K2-T8-rc       TensorPipeLayer with K=2, T=8 and recompute;
  K2-T8-norc     the same without recompute;
  K2-T8-rcg      recompute with recompute_impl='tf_recompute_grad'.
  K2-T8-1f1b-rc  TensorPipeLayer with schedule='1f1b' (one forward, one
                 backward; the loss inside the pipeline, trained through
                 FPropLoss) and recompute; paired with its GPipe twin
                 K2-T8-rc in the same process;
  K2-T8-1f1b-norc  the same without recompute (reported as not run with the
                 engine's reason where the engine does not build it).
  K2-T8-i2-rc    schedule='interleaved_1f1b' with num_stages_per_device=2
                 (the layers cut into K v stages, round-robin) and
                 recompute; paired with its GPipe and 1F1B twins (K2-T8-rc,
                 K2-T8-1f1b-rc); -norc without recompute. Timed, not
                 predicted (the fitted simulator models gpipe and 1f1b).
  K2-T8-zbh1-rc  schedule='zb_h1' (the backward split into I and W); -zbv-
                 schedule='zb_v' (2 stages per device in a V); paired as
                 the interleaved ones.
  K8-T32-rc-u1   a GPipe setting with TensorPipeLayer's unroll_ticks=1 (one
                 steady clock tick per loop iteration; without -u<n> the
                 layer's default, 2; see its param).

Usage:
  s = ParseSetting('K4-T8-rc')     # Setting(kind='pipe', 4, 8, True, ...)
  s.threads                        # (1, 4): intra-op, inter-op threads
  PairedBaselines('K4-T8-rc')      # ['plain', 'naive-4']
  PairedBaselines('K4-T8-1f1b-rc') # ['plain', 'naive-4', 'K4-T8-rc']
"""

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

from tensorpipe import schedules


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
  """A built-in micro-benchmark: `num_layers` equal layers.

  Attributes:
    description: one line for the flag help and the report.
    layer: 'fc' (relu(x @ W + b), W [dim, dim]), 'conv3x3' (relu(conv
      3x3), dim -> dim channels, no bias; both with end_dim from dim to
      end_dim in equal steps) or 'xfmr' (a Transformer encoder
      layer: self-attention with `dim // 32` heads of 32, then a
      feed-forward block of width 4 * dim, post layer norm).
    num_layers: number of layers.
    dim: FC width, conv channels or the Transformer's model dim.
    batch: mini-batch size N.
    image_size: conv only: the input is [N, image_size, image_size, dim].
    seq_len: xfmr only: the input is [N, seq_len, dim] (float vectors: the
      benchmark times the layers, not an embedding).
    end_dim: fc and conv3x3: the last layer's output width (channels);
      layer i maps widths[i] -> widths[i + 1], the num_layers + 1 widths
      rounded from equal steps of dim to end_dim (0: every layer dim ->
      dim).
  """
  description: str
  layer: str
  num_layers: int
  dim: int
  batch: int
  image_size: int = 0
  seq_len: int = 0
  end_dim: int = 0

  @property
  def widths(self) -> List[int]:
    """fc, conv3x3: the num_layers + 1 widths the layers map between."""
    end = self.end_dim or self.dim
    return [round(self.dim + (end - self.dim) * i / self.num_layers)
            for i in range(self.num_layers + 1)]

  @property
  def input_shape(self) -> List[int]:
    """Shape of the model's one input ([N, dim], [N, H, W, dim] or
    [N, S, dim])."""
    if self.layer == 'conv3x3':
      return [self.batch, self.image_size, self.image_size, self.dim]
    if self.layer == 'xfmr':
      return [self.batch, self.seq_len, self.dim]
    return [self.batch, self.dim]


BUILTIN_MODELS: Dict[str, BuiltinModel] = {
    'dense16': BuiltinModel(
        '16 layers relu(x @ W + b), W 1024x1024, batch 64, float32',
        'fc', 16, 1024, 64),
    'conv16': BuiltinModel(
        '16 layers relu(conv3x3), 16 -> 16 channels, no bias, input '
        '[64, 32, 32, 16] NHWC, float32', 'conv3x3', 16, 16, 64, 32),
    'conv16b256': BuiltinModel(
        'conv16 at batch 256 (input [256, 32, 32, 16]): the many-core '
        'scaling runs, T=32 micro-batches of 8', 'conv3x3', 16, 16, 256, 32),
    'dense32': BuiltinModel(
        '32 layers relu(x @ W + b), W 1024x1024, batch 64, float32',
        'fc', 32, 1024, 64),
    'dense32mem': BuiltinModel(
        '32 layers relu(x @ W + b), W 256x256, batch 4096, float32: '
        'activation-dominated, for the memory target', 'fc', 32, 256, 4096),
    'xfmr8': BuiltinModel(
        '8 Transformer encoder layers, model dim 128, 4 heads, FF 512, '
        'input [32, 32, 128] float32', 'xfmr', 8, 128, 32, seq_len=32),
    'dense4w256': BuiltinModel(
        '4 layers relu(x @ W + b), W 256x256, batch 64, float32: 2 layers '
        'per device at K=2 (the engine overhead check)', 'fc', 4, 256, 64),
    'dense32w256': BuiltinModel(
        '32 layers relu(x @ W + b), W 256x256, batch 64, float32: 16 '
        'layers per device at K=2 (the engine overhead check)', 'fc', 32,
        256, 64),
    'taper16': BuiltinModel(
        '16 layers relu(x @ W + b), widths 256 -> 1024 in equal steps '
        '(W 256x304 ... 976x1024), batch 64, float32: uneven on purpose, '
        'the last 8 layers 77% of the FLOPs (the planner against uniform '
        'cuts)', 'fc', 16, 256, 64, end_dim=1024),
    'taperconv16': BuiltinModel(
        '16 layers relu(conv3x3), 8 -> 32 channels in equal steps, no '
        'bias, input [64, 32, 32, 8] NHWC, float32: uneven on purpose, the '
        'last 8 layers 77% of the FLOPs (the planner against uniform cuts)',
        'conv3x3', 16, 8, 64, 32, end_dim=32),
    'tiny': BuiltinModel('4 layers relu(x @ W + b), W 8x8, batch 8 (smoke '
                         'tests)', 'fc', 4, 8, 8),
}


@dataclasses.dataclass(frozen=True)
class Setting:
  """One benchmark configuration (see the module docstring for the names).

  Attributes:
    name: the setting's name, e.g. 'K2-T8-rc'.
    kind: 'plain' (no TensorPipeLayer) or 'pipe'.
    num_partitions: K.
    num_micro_batches: T.
    recompute: whether the pipeline recomputes the forward pass.
    recompute_impl: TensorPipeLayer's recompute_impl.
    serial: naive-K-serial: one inter-op thread.
    schedule: TensorPipeLayer's schedule, 'gpipe', '1f1b' or
      'interleaved_1f1b'.
    num_stages_per_device: TensorPipeLayer's num_stages_per_device (v).
    unroll_ticks: TensorPipeLayer's unroll_ticks (GPipe only); None: the
      layer's default.
  """
  name: str
  kind: str
  num_partitions: int = 1
  num_micro_batches: int = 1
  recompute: bool = False
  recompute_impl: str = 'explicit'
  serial: bool = False
  schedule: str = 'gpipe'
  unroll_ticks: Optional[int] = None
  num_stages_per_device: int = 1

  @property
  def threads(self) -> Tuple[int, int]:
    """(intra-op, inter-op) threads: one core per device (or one in all)."""
    return 1, 1 if self.serial else max(1, self.num_partitions)


_SETTING_RE = re.compile(
    r'^K(\d+)-T(\d+)-(1f1b-)?(rc|norc|rcg)(?:-u([1-9]\d*))?$')


def ParseSetting(name: str) -> Setting:
  """Parses a setting name such as 'plain', 'naive-2' or 'K4-T8-rc'.

  Raises:
    ValueError: for an unknown name, listing the accepted forms.
  """
  if name == 'plain':
    return Setting(name, 'plain')
  m = re.match(r'^plain-T(\d+)$', name)
  if m and int(m.group(1)) >= 1:
    return Setting(name, 'plain', 1, int(m.group(1)), False)
  m = re.match(r'^naive-(\d+)(-serial)?$', name)
  if m and int(m.group(1)) >= 1:
    return Setting(name, 'pipe', int(m.group(1)), 1, False,
                   serial=bool(m.group(2)))
  m = re.match(r'^K(\d+)-T(\d+)-(i[2-9]|zbh1|zbv)-(rc|norc)$', name)
  if m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1:
    token = m.group(3)
    schedule, v = (('zb_h1', 1) if token == 'zbh1' else
                   ('zb_v', 2) if token == 'zbv' else
                   ('interleaved_1f1b', int(token[1:])))
    return Setting(name, 'pipe', int(m.group(1)), int(m.group(2)),
                   m.group(4) == 'rc', schedule=schedule,
                   num_stages_per_device=v)
  m = _SETTING_RE.match(name)
  if (m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1 and
      not (m.group(3) and m.group(4) == 'rcg') and
      not (m.group(3) and m.group(5))):
    mode = m.group(4)
    return Setting(name, 'pipe', int(m.group(1)), int(m.group(2)),
                   mode != 'norc',
                   'tf_recompute_grad' if mode == 'rcg' else 'explicit',
                   schedule='1f1b' if m.group(3) else 'gpipe',
                   unroll_ticks=int(m.group(5)) if m.group(5) else None)
  raise ValueError(f'unknown benchmark setting {name!r}; use plain, '
                   'plain-T<t> (e.g. plain-T8), naive-K (e.g. naive-2), '
                   'naive-K-serial, '
                   'K<k>-T<t>-<rc|norc|rcg> (e.g. K4-T8-rc) or '
                   'K<k>-T<t>-1f1b-<rc|norc> (e.g. K2-T32-1f1b-rc), '
                   'K<k>-T<t>-i<v>-<rc|norc> (interleaved 1F1B, v = 2..9 '
                   'stages per device, e.g. K2-T8-i2-rc), '
                   'K<k>-T<t>-<zbh1|zbv>-<rc|norc> (ZB-H1, ZB-V), '
                   'GPipe ones optionally with -u<n> for unroll_ticks=n '
                   '(e.g. K8-T32-rc-u1)')


def ScheduleTable(setting: Setting):
  """The schedules.Schedule a pipelined setting runs (GPipe's: its forward
  then its backward ticks)."""
  from tensorpipe import schedule_builders  # pylint: disable=g-import-not-at-top
  return schedule_builders.Build(setting.schedule, setting.num_partitions,
                                 setting.num_micro_batches,
                                 setting.num_stages_per_device)


def GridSettings(ks: Sequence[int] = (1, 2, 4),
                 ts: Sequence[int] = (1, 4, 8)) -> List[str]:
  """plain, plain-T, naive-K(-serial) for K > 1, every (K, T) x recompute."""
  names = ['plain'] + [f'plain-T{t}' for t in ts if t > 1]
  names += [f'naive-{k}{suffix}' for k in ks if k > 1
            for suffix in ('', '-serial')]
  for k in ks:
    for t in ts:
      names += [f'K{k}-T{t}-rc', f'K{k}-T{t}-norc']
  return names


def PairedBaselines(setting_name: str) -> List[str]:
  """Settings timed in the same process as `setting_name`, interleaved.

  Separate processes of the same setting differ by up to ~25% on this
  machine (memory layout, oneDNN caches), so every ratio the targets use is
  taken between functions timed step by step in turn in one process: plain
  for every setting (plain-T<t> too for K=1, T > 1), naive-K for K > 1 and
  T > 1, the no-recompute twin for K=1 recompute settings, and the GPipe
  twin with recompute (K<k>-T<t>-rc) for 1F1B settings. Baselines run
  with the setting's threads (e.g. plain with K inter-op threads next to a
  K-partition setting).
  """
  s = ParseSetting(setting_name)
  if s.kind == 'plain':
    return [] if s.name == 'plain' else ['plain']
  out = ['plain']
  k, t = s.num_partitions, s.num_micro_batches
  if k == 1 and t > 1:
    out.append(f'plain-T{t}')
  if k > 1 and t > 1:
    out.append(f'naive-{k}')
  if k == 1 and s.recompute and not schedules.LossInside(s.schedule):
    out.append(f'K1-T{t}-norc')
  if schedules.LossInside(s.schedule):
    out.append(f'K{k}-T{t}-rc')
  if s.schedule not in ('gpipe', '1f1b'):
    out.append(f'K{k}-T{t}-1f1b-rc')
  return out
