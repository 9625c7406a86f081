"""The issue's benchmark targets, written as data, and their evaluation.

Three kinds of rows, each a table below:
  SPEED_TARGETS      step-time ratios of two settings of one model (dense16
                     and conv16), from the setting's own process when the
                     baseline was paired with it;
  MEMORY_TARGETS     memory ratios of two settings of dense32mem;
  SIMULATOR_TARGETS  the largest |predicted / measured - 1| of a subset of
                     the pipelined results;
  ONE_F_ONE_B_*      1F1B next to GPipe (issue 11), rows given only when a
                     1F1B setting was run.
A row without a limit is an explanatory ratio ('explains' in the table),
not a target.

Usage:
  rows = EvaluateTargets(results, num_cores=16)   # [results.TargetRow]
"""

import dataclasses
import os
from typing import Callable, List, Optional, Sequence

from tools.benchmark_lib import results as results_lib

Result = results_lib.Result


@dataclasses.dataclass(frozen=True)
class RatioTarget:
  """Step time of `setting` / step time of `baseline` for one model.

  Attributes:
    text: the row's text; '{model}' is replaced by the model's name.
    setting, baseline: setting names.
    throughput: compare throughputs instead (the inverse ratio).
    op, limit: '<=' or '>=' and the limit; None for an explanatory ratio.
  """
  text: str
  setting: str
  baseline: str
  throughput: bool = False
  op: Optional[str] = None
  limit: Optional[float] = None


SPEED_MODELS = ('dense16', 'conv16')
SPEED_TARGETS = (
    RatioTarget('1. {model}: K1-T1-norc time / plain time',
                'K1-T1-norc', 'plain', op='<=', limit=1.05),
    RatioTarget('2. {model}: throughput K1-T1-rc / K1-T1-norc',
                'K1-T1-rc', 'K1-T1-norc', throughput=True, op='>=',
                limit=0.85),
    RatioTarget('2b. {model}: throughput K1-T8-rc / K1-T8-norc (recompute '
                'really done)', 'K1-T8-rc', 'K1-T8-norc', throughput=True,
                op='>=', limit=0.85),
    RatioTarget('3. {model}: K1-T8-rc time / plain time',
                'K1-T8-rc', 'plain', op='<=', limit=1.3),
    RatioTarget('3a. {model}: plain-T8 time / plain time (micro-batching '
                'alone, no pipeline code)', 'plain-T8', 'plain'),
    RatioTarget('3b. {model}: K1-T8-rc time / plain-T8 time (the engine '
                'with recompute vs micro-batching alone)',
                'K1-T8-rc', 'plain-T8'),
    RatioTarget('4. {model}: throughput K2-T8-rc / naive-2',
                'K2-T8-rc', 'naive-2', throughput=True, op='>=', limit=1.6),
    RatioTarget('4a. {model}: throughput K2-T8-rc / naive-2-serial (naive-2 '
                'with one op at a time, as on 2 single-core devices; '
                'separate processes)', 'K2-T8-rc', 'naive-2-serial',
                throughput=True),
    RatioTarget('4b. {model}: throughput K2-T8-rc / K1-T8-rc (what the '
                'second device adds to the same micro-batched work; '
                'separate processes)', 'K2-T8-rc', 'K1-T8-rc',
                throughput=True),
)


@dataclasses.dataclass(frozen=True)
class MemoryTarget:
  """A memory figure of `setting` / the same figure of `baseline`.

  Attributes:
    text: the row's text.
    measure: a function of results.Memory giving bytes (or None).
    setting, baseline: setting names (of `model`).
    limit: the ratio must be `op` this.
    model: the model both were run on.
    op: '<=' or '<'.
  """
  text: str
  measure: Callable[[results_lib.Memory], Optional[int]]
  setting: str
  baseline: str
  limit: float
  model: str = 'dense32mem'
  op: str = '<='


MEMORY_MODEL = 'dense32mem'
MEMORY_TARGETS = (
    MemoryTarget('5. dense32mem: peak activation memory K1-T8-rc / plain (TF '
                 'allocator peak during a step minus weights and inputs)',
                 lambda m: m.activation_peak_bytes, 'K1-T8-rc', 'plain',
                 round(1 / 3, 3)),
    MemoryTarget('5b. dense32mem: peak RSS above idle K1-T8-rc / plain '
                 '(whole process, for reference)',
                 lambda m: m.peak_above_idle_bytes, 'K1-T8-rc', 'plain',
                 round(1 / 3, 3)),
)


# 1F1B (issue 11): memory on dense32mem (boundary activations dominate),
# speed on the speed models, at K=2, T=32, each against GPipe with
# recompute. The no-recompute rows stay 'not run' while the engine builds
# 1F1B with recompute only (the report lists the engine's reason).
ONE_F_ONE_B_MEMORY_TARGETS = (
    MemoryTarget('7. dense32mem: activation peak K2-T32-1f1b-rc / K2-T32-rc '
                 '(TF allocator; 1F1B keeps min(K-k, T) boundary inputs per '
                 'partition, GPipe T)', lambda m: m.activation_peak_bytes,
                 'K2-T32-1f1b-rc', 'K2-T32-rc', 1.0, op='<'),
    MemoryTarget('7a. dense32mem: peak RSS above idle K2-T32-1f1b-rc / '
                 'K2-T32-rc (whole process, for reference)',
                 lambda m: m.peak_above_idle_bytes, 'K2-T32-1f1b-rc',
                 'K2-T32-rc', 1.0, op='<'),
    MemoryTarget('8b. conv16: activation peak K2-T32-1f1b-norc / K2-T32-rc',
                 lambda m: m.activation_peak_bytes, 'K2-T32-1f1b-norc',
                 'K2-T32-rc', 1.5, model='conv16'),
)
ONE_F_ONE_B_SPEED_TARGETS = (
    RatioTarget('8. {model}: throughput K2-T32-1f1b-rc / K2-T32-rc (same '
                'process)', 'K2-T32-1f1b-rc', 'K2-T32-rc', throughput=True),
    RatioTarget('8a. {model}: throughput K2-T32-1f1b-norc / K2-T32-rc (1F1B '
                'without full recompute)', 'K2-T32-1f1b-norc', 'K2-T32-rc',
                throughput=True, op='>=', limit=1.15),
)


@dataclasses.dataclass(frozen=True)
class SimulatorTarget:
  """The largest prediction error over the results `keep` selects.

  Attributes:
    text: the row's text; '{models}' and '{cores}' are filled in.
    keep: keep(num_partitions, num_micro_batches, cores) selects results
      (K=1 runs with loops, the calibration fit, are always left out).
    limit: the error must be <= this; None for an explanatory row.
  """
  text: str
  keep: Callable[[int, int, int], bool]
  limit: Optional[float] = None


SIMULATOR_TARGETS = (
    SimulatorTarget('6. simulator ({models}): largest |predicted / measured '
                    '- 1| (K in 1,2,4; T in 1,4,8; K=1 runs with loops are '
                    'the calibration fit)',
                    lambda k, t, cores: k in (1, 2, 4) and t in (1, 4, 8),
                    0.15),
    SimulatorTarget('6a. simulator, K <= {cores} (one core per device): '
                    'largest error',
                    lambda k, t, cores: 1 < k <= cores or (k == 1 and t > 1)),
    SimulatorTarget('6b. simulator, K > {cores} (devices share cores): '
                    'largest error', lambda k, t, cores: k > cores),
    SimulatorTarget('6c. simulator, K=1, T=1 (loop-free fast path, isolated '
                    'costs): largest error',
                    lambda k, t, cores: k == 1 and t == 1),
)


def _Find(results: Sequence[Result], model: str,
          setting: str) -> Optional[Result]:
  for r in results:
    if r.model == model and r.setting.name == setting:
      return r
  return None


def _Row(text: str, value: Optional[float], op: Optional[str],
         limit: Optional[float]) -> results_lib.TargetRow:
  if op is None:
    return results_lib.TargetRow(text, value, '-', None, info=True)
  compare = {'<=': lambda v: v <= limit, '<': lambda v: v < limit,
             '>=': lambda v: v >= limit}[op]
  passed = None if value is None else compare(value)
  return results_lib.TargetRow(text, value, f'{op} {limit}', passed)


def _Ratio(results: Sequence[Result], model: str,
           target: RatioTarget) -> Optional[float]:
  """Step time of the setting / the baseline's, from the setting's process
  when the baseline was paired with it."""
  ra = _Find(results, model, target.setting)
  if not ra:
    return None
  tb = ra.PairedTime(target.baseline)
  if tb is None:
    rb = _Find(results, model, target.baseline)
    if not rb:
      return None
    tb = rb.step_time_s
  x = ra.step_time_s / tb
  return 1.0 / x if target.throughput else x


def _MemoryRatio(results: Sequence[Result],
                 target: MemoryTarget) -> Optional[float]:
  a = _Find(results, target.model, target.setting)
  b = _Find(results, target.model, target.baseline)
  if not a or not b:
    return None
  ma, mb = target.measure(a.memory), target.measure(b.memory)
  return ma / mb if ma is not None and mb else None


def EvaluateTargets(results: Sequence[Result],
                    num_cores: Optional[int] = None
                    ) -> List[results_lib.TargetRow]:
  """The issue's targets 1-6 as rows (text, measured ratio, limit, passed).

  Rows are given for the built-in models that were run (dense16, conv16,
  dense32mem); missing settings give rows with ratio None (not evaluated).
  The simulator rows are about the speed models; for other models the same
  rows describe the models that were run.
  """
  rows = []
  run_models = {r.model for r in results}
  for model in SPEED_MODELS:
    if model in run_models:
      rows += [_Row(t.text.format(model=model), _Ratio(results, model, t),
                    t.op, t.limit) for t in SPEED_TARGETS]
  if MEMORY_MODEL in run_models:
    rows += [_Row(t.text, _MemoryRatio(results, t), t.op, t.limit)
             for t in MEMORY_TARGETS]
  if any(r.setting.schedule == '1f1b' for r in results):
    rows += [_Row(t.text, _MemoryRatio(results, t), t.op, t.limit)
             for t in ONE_F_ONE_B_MEMORY_TARGETS if t.model in run_models]
    for model in SPEED_MODELS:
      if model in run_models:
        rows += [_Row(t.text.format(model=model), _Ratio(results, model, t),
                      t.op, t.limit) for t in ONE_F_ONE_B_SPEED_TARGETS]
  sim_models = (set(SPEED_MODELS) & run_models) or (
      run_models - {MEMORY_MODEL})
  if not sim_models:
    return rows
  cores = num_cores or os.cpu_count() or 1
  names = ', '.join(sorted(sim_models))
  for t in SIMULATOR_TARGETS:
    errs = [abs(r.prediction.error) for r in results
            if r.prediction and r.prediction.error is not None
            and not r.prediction.calibration_run and r.model in sim_models
            and t.keep(r.num_partitions, r.num_micro_batches, cores)]
    rows.append(_Row(t.text.format(models=names, cores=cores),
                     max(errs) if errs else None,
                     '<=' if t.limit is not None else None, t.limit))
  return rows
