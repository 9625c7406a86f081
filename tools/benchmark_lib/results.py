"""Typed benchmark results and their results.json form (pure Python, no TF).

A child process measures one setting and returns a `Result`; the parent adds
the speed-up (`Speedup`) and the simulator's prediction (`Prediction`) and
writes a `Report`. Every structure converts to and from the JSON written to
results.json (`ToJson` / `FromJson`), whose keys are the ones the report has
always had: a results.json of an earlier run re-renders with --report_from.

Usage:
  r = Result.FromJson(json.loads(line))
  r.setting.num_partitions, r.step_time_s, r.memory.activation_peak_bytes
  json.dumps(r.ToJson())
"""

import dataclasses
import statistics
from typing import Any, Dict, List, Optional, Sequence

from tensorpipe import simulator
from tools.benchmark_lib import settings
from tools.benchmark_lib import step_profile as step_profile_lib

PHASES = ('forward', 'recompute', 'backward')
# The child prints its result as one line: this prefix, then the JSON.
RESULT_LINE_PREFIX = 'BENCHMARK_RESULT '


def _Omit(d: Dict[str, Any]) -> Dict[str, Any]:
  """The entries of `d` whose value is not None."""
  return {k: v for k, v in d.items() if v is not None}


class _FlatJson:
  """ToJson / FromJson of a dataclass whose JSON keys are its fields (None
  fields left out)."""

  def ToJson(self) -> Dict[str, Any]:
    return _Omit(dataclasses.asdict(self))

  @classmethod
  def FromJson(cls, d: Dict[str, Any]):
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class PhaseCosts:
  """Seconds per partition of each phase of one micro-batch's stage call.

  `recompute` is None for costs measured without it (a partition timed
  alone: forward, and backward = vjp without the forward).
  """
  forward: List[float]
  backward: List[float]
  recompute: Optional[List[float]] = None

  def ToJson(self) -> Dict[str, List[float]]:
    return _Omit({'forward': self.forward, 'recompute': self.recompute,
                  'backward': self.backward})

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> 'PhaseCosts':
    return cls(d['forward'], d['backward'], d.get('recompute'))


@dataclasses.dataclass(frozen=True)
class StageCosts:
  """The cells recorded inside the running pipeline, per partition.

  Attributes:
    median: median duration of each phase's cells.
    alone: their lower quartile: with more devices than cores a cell's wall
      time includes waiting for a core, and the quickest cells are those
      that had one to themselves, i.e. the cell's work.
  """
  median: PhaseCosts
  alone: PhaseCosts

  @classmethod
  def FromEvents(cls, events: Sequence[Any],
                 num_partitions: int) -> 'StageCosts':
    """Statistics of timeline events (phase, k, start, end) per partition.

    These are the stage costs inside the running pipeline (warm caches, no
    per-call dispatch), as opposed to a partition timed alone.
    """
    median, alone = {}, {}
    for phase in PHASES:
      per_k = [sorted(e.end - e.start for e in events
                      if e.phase == phase and e.k == k) or [0.0]
               for k in range(num_partitions)]
      median[phase] = [statistics.median(d) for d in per_k]
      alone[phase] = [d[(len(d) - 1) // 4] for d in per_k]
    return cls(PhaseCosts(**median), PhaseCosts(**alone))

  def ToJson(self) -> Dict[str, Any]:
    return {'alone': self.alone.ToJson(), **self.median.ToJson()}

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> 'StageCosts':
    return cls(PhaseCosts.FromJson(d), PhaseCosts.FromJson(d['alone']))


@dataclasses.dataclass(frozen=True)
class Memory(_FlatJson):
  """Memory of a setting over its warm-up steps, in bytes.

  Attributes:
    idle_rss_bytes: resident set size before the first step.
    peak_rss_bytes: peak RSS (VmHWM) at the end of the warm-up steps.
    peak_above_idle_bytes: the difference, clipped at 0.
    peak_reset: whether the kernel's peak counter could be reset first.
    tf_allocator: TF's CPU allocator figures ('current', 'peak',
      'current_before_step', 'activation_peak_bytes'), or None.
  """
  idle_rss_bytes: int
  peak_rss_bytes: int
  peak_above_idle_bytes: int
  peak_reset: bool
  tf_allocator: Optional[Dict[str, int]] = None

  @property
  def activation_peak_bytes(self) -> Optional[int]:
    """The allocator's peak during a step minus what was allocated before
    it (weights and inputs), or None."""
    return (self.tf_allocator or {}).get('activation_peak_bytes')

  def ToJson(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)   # tf_allocator: None is written too


@dataclasses.dataclass(frozen=True)
class StepTimes(_FlatJson):
  """A baseline timed in the same process as the setting (`paired`)."""
  step_time_s: float
  step_times_s: Optional[List[float]] = None


@dataclasses.dataclass(frozen=True)
class TimelineRecord(_FlatJson):
  """One recorded step: its files, breakdown, events and marks."""
  chrome_trace: str
  png: str
  breakdown_s: Dict[str, float]
  num_events: int
  events: List[Dict[str, Any]]
  marks: Dict[str, float]


@dataclasses.dataclass(frozen=True)
class Speedup:
  """Baseline step time / the setting's step time.

  Attributes:
    vs: the baseline's setting name, or None when it was not run.
    value: the ratio, or None.
    paired: whether the baseline was timed in the setting's own process.
  """
  vs: Optional[str]
  value: Optional[float]
  paired: bool


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The simulator's step time for a pipelined result.

  Attributes:
    calibration_run: a K=1 run with loops: the overheads were fitted to it.
    step_s: the prediction the table shows (from the pipeline's own cells
      when recorded, else from the isolated partition costs), or None.
    source: 'pipeline' or 'isolated', the costs `step_s` comes from.
    error: step_s / the step time it is compared with - 1.
    isolated_step_s: prediction from each partition timed alone on
      `num_cores` shared cores, or None.
    error_isolated: isolated_step_s / measured step time - 1.
    ideal_step_s, bubble_fraction, busy_s: the isolated-cost simulation
      with one core per device.
    uncalibrated: no K=1 fit for the overheads: predicted without them.
  """
  calibration_run: bool
  step_s: Optional[float] = None
  source: Optional[str] = None
  error: Optional[float] = None
  isolated_step_s: Optional[float] = None
  error_isolated: Optional[float] = None
  ideal_step_s: Optional[float] = None
  bubble_fraction: Optional[float] = None
  busy_s: Optional[List[float]] = None
  uncalibrated: bool = False

  def ToJson(self) -> Dict[str, Any]:
    return _Omit({
        'predicted_step_s': self.step_s,
        'predicted_isolated_step_s': self.isolated_step_s,
        'predicted_ideal_step_s': self.ideal_step_s,
        'predicted_bubble_fraction': self.bubble_fraction,
        'predicted_busy_s': self.busy_s,
        'prediction_uncalibrated': self.uncalibrated or None,
        'calibration_run': self.calibration_run,
        'prediction_source': self.source,
        'prediction_error': self.error,
        'prediction_error_isolated': self.error_isolated})

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> Optional['Prediction']:
    """The prediction stored in a result's JSON, or None if it has none."""
    if 'calibration_run' not in d:
      return None
    return cls(
        calibration_run=d['calibration_run'],
        step_s=d.get('predicted_step_s'), source=d.get('prediction_source'),
        error=d.get('prediction_error'),
        isolated_step_s=d.get('predicted_isolated_step_s'),
        error_isolated=d.get('prediction_error_isolated'),
        ideal_step_s=d.get('predicted_ideal_step_s'),
        bubble_fraction=d.get('predicted_bubble_fraction'),
        busy_s=d.get('predicted_busy_s'),
        uncalibrated=bool(d.get('prediction_uncalibrated', False)))


@dataclasses.dataclass
class Result:
  """One setting of one model, as measured in its child process.

  `speedup` and `prediction` are filled in by the parent
  (analysis.AddSpeedups, analysis.AddPredictions).

  Attributes:
    model: built-in model name or experiment key.
    setting: the parsed setting.
    batch: mini-batch size N.
    step_time_s: median step time of the timed rounds.
    memory: the setting's memory over its warm-up steps.
    step_times_s: every timed step.
    steps, warmup: timed and warm-up steps.
    trace_s, warmup_s: seconds to trace the step and to run the warm-up.
    paired: baselines timed in the same rotation, by setting name.
    paired_trace_s: seconds to trace a paired baseline's step, where
      measured (--ramp_check's switching-ramps twin).
    timeline: the recorded step, for --timeline settings.
    partition_costs_s: each partition timed alone on one micro-batch.
    stage_costs_s: the cells recorded inside the running pipeline.
    recorded_step_time_s: median wall time of the recorded steps.
    step_profile: the median profiled step (step_profile.StepProfile).
    cpu_s: this process's CPU seconds per timed step (user + system),
      where the rotation timed the setting alone; else None.
    pid_cpu_s: per process of `runner.RunSetting`'s cpu_pids (the TF
      servers of stages in other processes), its CPU seconds per timed
      step, read from /proc around the same rounds.
  """
  model: str
  setting: settings.Setting
  batch: int
  step_time_s: float
  memory: Memory
  step_times_s: List[float] = dataclasses.field(default_factory=list)
  steps: int = 0
  warmup: int = 0
  trace_s: float = 0.0
  warmup_s: float = 0.0
  paired: Dict[str, StepTimes] = dataclasses.field(default_factory=dict)
  paired_trace_s: Dict[str, float] = dataclasses.field(default_factory=dict)
  timeline: Optional[TimelineRecord] = None
  partition_costs_s: Optional[PhaseCosts] = None
  stage_costs_s: Optional[StageCosts] = None
  recorded_step_time_s: Optional[float] = None
  speedup: Optional[Speedup] = None
  prediction: Optional[Prediction] = None
  step_profile: Optional[step_profile_lib.StepProfile] = None
  cpu_s: Optional[float] = None
  pid_cpu_s: List[float] = dataclasses.field(default_factory=list)

  @property
  def num_partitions(self) -> int:
    return self.setting.num_partitions

  @property
  def num_micro_batches(self) -> int:
    return self.setting.num_micro_batches

  @property
  def pipelined(self) -> bool:
    return self.setting.kind == 'pipe'

  @property
  def examples_per_s(self) -> float:
    return self.batch / self.step_time_s

  def PairedTime(self, baseline: str) -> Optional[float]:
    """The baseline's step time measured in this result's process, if any."""
    p = self.paired.get(baseline)
    return p.step_time_s if p else None

  def ToJson(self) -> Dict[str, Any]:
    """The result as a results.json entry (flat keys, as always written)."""
    s = self.setting
    intra, inter = s.threads
    out = {
        'model': self.model, 'setting': s.name, 'kind': s.kind,
        'K': s.num_partitions, 'T': s.num_micro_batches,
        'recompute': s.recompute, 'recompute_impl': s.recompute_impl,
        'batch': self.batch,
        'threads': {'intra_op': intra, 'inter_op': inter},
        'steps': self.steps, 'warmup': self.warmup,
        'step_times_s': self.step_times_s, 'step_time_s': self.step_time_s,
        'examples_per_s': self.examples_per_s, 'trace_s': self.trace_s,
        'warmup_s': self.warmup_s,
        'paired': {name: p.ToJson() for name, p in self.paired.items()},
        'memory': self.memory.ToJson()}
    if self.paired_trace_s:
      out['paired_trace_s'] = dict(self.paired_trace_s)
    for key, value in (('timeline', self.timeline),
                       ('partition_costs_s', self.partition_costs_s),
                       ('stage_costs_s', self.stage_costs_s)):
      if value is not None:
        out[key] = value.ToJson()
    if self.recorded_step_time_s is not None:
      out['recorded_step_time_s'] = self.recorded_step_time_s
    if self.step_profile is not None:
      out['step_profile'] = self.step_profile.ToJson()
    if self.cpu_s is not None:
      out['cpu_s'] = self.cpu_s
    if self.pid_cpu_s:
      out['pid_cpu_s'] = list(self.pid_cpu_s)
    if self.speedup is not None:
      out.update(speedup_vs=self.speedup.vs, speedup=self.speedup.value,
                 speedup_paired=self.speedup.paired)
    if self.prediction is not None:
      out.update(self.prediction.ToJson())
    return out

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> 'Result':
    """Reads a results.json entry.

    Raises:
      KeyError / TypeError / ValueError: `d` is not such an entry.
    """
    def Opt(key, reader):
      return reader(d[key]) if d.get(key) is not None else None
    speedup = None
    if 'speedup' in d:
      speedup = Speedup(d['speedup_vs'], d['speedup'], d['speedup_paired'])
    return cls(
        model=d['model'], setting=settings.ParseSetting(d['setting']),
        batch=d['batch'], step_time_s=d['step_time_s'],
        memory=Memory.FromJson(d['memory']),
        step_times_s=d.get('step_times_s', []), steps=d.get('steps', 0),
        warmup=d.get('warmup', 0), trace_s=d.get('trace_s', 0.0),
        warmup_s=d.get('warmup_s', 0.0),
        paired={name: StepTimes.FromJson(p)
                for name, p in (d.get('paired') or {}).items()},
        paired_trace_s=dict(d.get('paired_trace_s') or {}),
        timeline=Opt('timeline', TimelineRecord.FromJson),
        partition_costs_s=Opt('partition_costs_s', PhaseCosts.FromJson),
        stage_costs_s=Opt('stage_costs_s', StageCosts.FromJson),
        recorded_step_time_s=d.get('recorded_step_time_s'),
        speedup=speedup, prediction=Prediction.FromJson(d),
        step_profile=Opt('step_profile',
                         step_profile_lib.StepProfile.FromJson),
        cpu_s=d.get('cpu_s'), pid_cpu_s=list(d.get('pid_cpu_s') or []))


@dataclasses.dataclass(frozen=True)
class TargetRow:
  """One row of the targets table.

  Attributes:
    target: the target's text (number, model, what is compared).
    measured: the measured ratio, or None when a setting was not run.
    limit: e.g. '<= 1.05'; '-' for an explanatory ratio.
    passed: True / False, or None when not evaluated (or explanatory).
    info: an explanatory ratio, not a target.
  """
  target: str
  measured: Optional[float]
  limit: str
  passed: Optional[bool]
  info: bool = False

  def ToJson(self) -> Dict[str, Any]:
    out = {'target': self.target, 'measured': self.measured,
           'limit': self.limit, 'passed': self.passed}
    if self.info:
      out['info'] = True
    return out

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> 'TargetRow':
    return cls(d['target'], d['measured'], d['limit'], d['passed'],
               bool(d.get('info', False)))


@dataclasses.dataclass
class Report:
  """Everything a benchmark run writes to results.json.

  Attributes:
    load_average_at_start: the 1-minute load average when it started.
    cpu_count: the machine's cores.
    wall_time_s: the run's duration.
    results: one per (model, setting) run.
    calibration: the simulator's overheads fitted per model, recompute
      mode and cost source, keyed 'model/rc/source' (analysis.AddPredictions).
    targets: the targets table.
    plots: PNG paths.
    timelines: the --timeline runs (their `timeline` is set).
    not_run: settings whose child failed, each {'model', 'setting',
      'reason'} (the child's last error line, e.g. the engine's ValueError
      for a mode it does not build).
  """
  load_average_at_start: float
  cpu_count: int
  wall_time_s: float
  results: List[Result]
  calibration: Dict[str, simulator.Calibration] = dataclasses.field(
      default_factory=dict)
  targets: List[TargetRow] = dataclasses.field(default_factory=list)
  plots: List[str] = dataclasses.field(default_factory=list)
  timelines: List[Result] = dataclasses.field(default_factory=list)
  not_run: List[Dict[str, str]] = dataclasses.field(default_factory=list)

  def ToJson(self) -> Dict[str, Any]:
    out = {
        'load_average_at_start': self.load_average_at_start,
        'cpu_count': self.cpu_count, 'wall_time_s': self.wall_time_s,
        'results': [r.ToJson() for r in self.results],
        'calibration': {key: dataclasses.asdict(c)
                        for key, c in self.calibration.items()},
        'targets': [t.ToJson() for t in self.targets],
        'plots': self.plots,
        'timelines': [t.ToJson() for t in self.timelines]}
    if self.not_run:
      out['not_run'] = self.not_run
    return out

  @classmethod
  def FromJson(cls, d: Dict[str, Any]) -> 'Report':
    """Reads results.json.

    Raises:
      KeyError / TypeError / ValueError: `d` is not a benchmark report.
    """
    return cls(
        load_average_at_start=d['load_average_at_start'],
        cpu_count=d['cpu_count'], wall_time_s=d['wall_time_s'],
        results=[Result.FromJson(r) for r in d['results']],
        calibration={key: simulator.Calibration(**c)
                     for key, c in d.get('calibration', {}).items()},
        targets=[TargetRow.FromJson(t) for t in d.get('targets', [])],
        plots=d.get('plots', []),
        timelines=[Result.FromJson(t) for t in d.get('timelines', [])],
        not_run=d.get('not_run', []))
