"""Speed-ups and simulator predictions of a set of benchmark results.

Runs in the parent process on the children's `results.Result`s: no
TensorFlow op is run here.

Usage:
  AddSpeedups(results, 'plain')              # sets r.speedup
  calibrations = AddPredictions(results)     # sets r.prediction
"""

import itertools
import os
from typing import Dict, List, Optional, Sequence, Tuple

from tensorpipe import schedule_builders
from tensorpipe import simulator
from tools.benchmark_lib import results as results_lib

Result = results_lib.Result
_SOURCES = ('pipeline', 'isolated')
# Ticks in flight of each schedule's loops (tf.while_loop's
# parallel_iterations): pipeline_train.GPIPE_PARALLEL_ITERATIONS and
# schedule_engine.PARALLEL_ITERATIONS (benchmark_1f1b_test checks both).
# 1F1B without recompute has no loop: its schedule is unrolled in the graph
# with per-partition control dependencies, i.e. dataflow (no tick barrier).
TICKS_IN_FLIGHT = {'gpipe': 1, '1f1b': 2}


def AddSpeedups(results: Sequence[Result], baseline: str) -> None:
  """Sets `r.speedup` (baseline step time / step time) of every result.

  The baseline's time from the same process (settings.PairedBaselines) is
  used when there is one (`paired` True), else the baseline's own run.
  """
  base = {r.model: r.step_time_s for r in results
          if r.setting.name == baseline}
  for r in results:
    paired = r.PairedTime(baseline)
    b = paired or base.get(r.model)
    r.speedup = results_lib.Speedup(
        vs=baseline if b else None, value=(b / r.step_time_s) if b else None,
        paired=paired is not None)


def StageCostsOf(r: Result, source: str = 'pipeline', alone: bool = False
                 ) -> Optional[Tuple[List[float], List[float]]]:
  """(forward, backward) per-partition costs of a result, or None.

  source 'pipeline': the cells recorded inside the running pipeline
  (`stage_costs_s`; with recompute the backward cost is recompute + backward
  - forward, so that the simulator's recompute (= forward) plus it is the
  measured cell; without, the recompute twin's backward cells, or for 1F1B
  its own); `alone`
  takes their lower quartile instead of the median. 'isolated': each
  partition timed alone (`partition_costs_s`).
  """
  if source == 'pipeline':
    c = r.stage_costs_s
    if not c:
      return None
    costs = c.alone if alone else c.median
    if not r.setting.recompute:
      return costs.forward, costs.backward
    return costs.forward, [max(0.0, rc + b - f) for f, rc, b in zip(
        costs.forward, costs.recompute, costs.backward)]
  c = r.partition_costs_s
  return (c.forward, c.backward) if c else None


def MeasuredStep(r: Result, source: str) -> float:
  """The step time a prediction from `source` costs is compared with.

  Pipeline-cell costs come from the recorded steps, which were timed in the
  same rotation: their own wall time is the fair comparison.
  """
  if source == 'pipeline' and r.recorded_step_time_s:
    return r.recorded_step_time_s
  return r.step_time_s


def _CalibrationKey(model: str, recompute: bool, source: str,
                    schedule: str = 'gpipe') -> str:
  mode = ('' if schedule == 'gpipe' else f'{schedule}-') + (
      'rc' if recompute else 'norc')
  return f'{model}/{mode}/{source}'


def _Calibrate(results: Sequence[Result]) -> Dict[str, simulator.Calibration]:
  """Overheads fitted per model, schedule, recompute mode and source to K=1
  runs with loops (T > 1)."""
  calib = {}
  for source in _SOURCES:
    for model in sorted({r.model for r in results}):
      for schedule, rc in itertools.product(('gpipe', '1f1b'), (True, False)):
        runs = []
        for r in results:
          s = r.setting
          costs = StageCostsOf(r, source) if r.pipelined else None
          if (costs and r.model == model and s.num_partitions == 1 and
              s.num_micro_batches > 1 and s.recompute == rc and
              s.recompute_impl == 'explicit' and s.schedule == schedule):
            runs.append((s.num_micro_batches, costs[0][0], costs[1][0],
                         MeasuredStep(r, source)))
        if runs:
          calib[_CalibrationKey(model, rc, source, schedule)] = (
              simulator.CalibrateFromK1(runs, rc))
  return calib


_NO_OVERHEAD = simulator.Calibration(0.0, 0.0, 0.0)


def _Predict(r: Result, calib: Dict[str, simulator.Calibration],
             cores: int) -> results_lib.Prediction:
  """The prediction of one pipelined (explicit-recompute) result."""
  s = r.setting
  k, t = s.num_partitions, s.num_micro_batches
  fast = k == 1 and t == 1
  predicted, extra = {}, {}
  uncalibrated = False
  for source in _SOURCES:
    costs = StageCostsOf(r, source)
    if not costs:
      continue
    # A 1F1B setting uses the fit of K=1 1F1B runs (its loop's own per-tick
    # cost), else GPipe's.
    c = calib.get(_CalibrationKey(r.model, s.recompute, source, s.schedule),
                  calib.get(_CalibrationKey(r.model, s.recompute, source)))
    if c is None:
      # No K=1 run with loops to fit the overheads: predict without them.
      c, uncalibrated = _NO_OVERHEAD, True
    kwargs = dict(recompute=s.recompute and not fast,
                  tick_overhead=0.0 if fast else c.tick_overhead,
                  fixed_overhead=c.fixed_overhead,
                  ticks_in_flight=TICKS_IN_FLIGHT[s.schedule],
                  synchronous_ticks=not (s.schedule == '1f1b' and
                                         not s.recompute))
    shared = k > cores
    if source == 'pipeline' and shared:
      # More devices than cores: the cells' work (their quickest quartile)
      # on `cores` cores, shared by the running cells.
      costs = StageCostsOf(r, source, alone=True)
    table = schedule_builders.Build(s.schedule, k, t)
    predicted[source] = simulator.SimulateSchedule(
        table, costs[0], costs[1],
        num_cores=(min(k, cores) if source == 'isolated' or shared
                   else None), **kwargs).step_time
    if source == 'isolated':
      ideal = simulator.SimulateSchedule(table, costs[0], costs[1], **kwargs)
      extra = dict(ideal_step_s=ideal.step_time,
                   bubble_fraction=ideal.bubble_fraction, busy_s=ideal.busy)
  source = next((src for src in _SOURCES if src in predicted), None)
  isolated = predicted.get('isolated')
  return results_lib.Prediction(
      calibration_run=k == 1 and t > 1,
      step_s=predicted.get(source), source=source,
      error=(predicted[source] / MeasuredStep(r, source) - 1.0
             if source else None),
      isolated_step_s=isolated,
      error_isolated=(isolated / r.step_time_s - 1.0
                      if isolated is not None else None),
      uncalibrated=uncalibrated, **extra)


def AddPredictions(results: Sequence[Result],
                   num_cores: Optional[int] = None
                   ) -> Dict[str, simulator.Calibration]:
  """Sets `r.prediction`, the simulator's step time, of pipelined results.

  Two predictions per result, from two sources of stage costs:
    'pipeline' (settings with loops): the setting's own cells recorded by
      the timeline inside the pipeline (median per partition and phase),
      compared with the wall time of those same recorded steps; for
      no-recompute settings the cells of the recompute twin timed in the
      same rotation, compared with the setting's time. This checks the
      schedule model (dependencies, clock ticks, bubble, overheads) given
      the costs, as the issue's simulator target asks. With K <= cores each
      device has a core; with more devices than cores the cells' work
      (lower quartile of their durations) is simulated on the shared cores.
    'isolated' (every setting): each partition timed alone on one
      micro-batch, i.e. what a user has before running the pipeline;
      devices share `num_cores` cores (processor sharing).
  Calibration per model, recompute mode and source: the per-tick overhead
  o and the fixed per-step overhead F are fitted by least squares to the
  K=1 GPipe runs with loops (T > 1) (simulator.CalibrateFromK1); K=1, T=1
  (the loop-free fast path: f + b + F) and every K > 1 run are
  out-of-sample. 1F1B settings are simulated with schedule='1f1b' (and
  the 1F1B loop's ticks in flight) from their own recorded cells, with the
  overheads fitted to K=1 1F1B runs (keys 'model/1f1b-rc/source'), or
  GPipe's fit when there are none.

  Returns:
    The calibrations, keyed 'model/rc/source' (e.g. 'dense16/rc/pipeline').
  """
  cores = num_cores or os.cpu_count() or 1
  calib = _Calibrate(results)
  for r in results:
    if (r.pipelined and r.setting.recompute_impl == 'explicit' and
        r.setting.schedule in TICKS_IN_FLIGHT):
      r.prediction = _Predict(r, calib, cores)
  return calib

