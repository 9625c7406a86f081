"""The fixed cost of one pipeline clock tick, per partition (tools/benchmark
--tick_cost).

A tick's own cost (loop control, the per-partition tf.cond, TensorArray reads
and writes, gathers, cross-device copies) decides how small a micro-batch
can usefully be. It is measured on a tiny model whose kernels cost next to
nothing: one FC layer 8 -> 8 per partition, micro-batches of 2 examples, so
the mini-batch has 2 T examples. For each K the child process (threads as
the benchmark's pipelined settings: one intra-op thread, K inter-op
threads) times, in one rotation, the forward loop alone (FProp in training
mode without a gradient: the loop that saves the boundary inputs), the full
training step (forward + backward loop + SGD update), the same step with
schedule='1f1b' (its one loop; FPropLoss under a tape; checkouts without
1F1B skip it), and the first two for the same K layers without a pipeline
(unrolled over the micro-batches: the stage work), at T=8 and T=32. Per
tick and partition:

  forward:  (fwd(T=32) - fwd(T=8)) / (24 K)
  backward: (step(T=32) - step(T=8)) / (24 K) - forward
  1F1B:     (step_1f1b(T=32) - step_1f1b(T=8)) / (48 K)

since T=32 runs 24 more ticks of each GPipe loop than T=8 (T + K - 1
ticks; 1F1B: 48 more of its one loop of 2 (T + K - 1)), and everything
else (tracing, the mini-batch split and merge, the loop set-up) is the
same. GPipe's 24 are ticks of the steady loop, which runs `unroll_ticks`
ticks per iteration (24 is a multiple of 2, 3 and 4, so both T leave the
same ticks over for the guarded ramp-up loop). The fixed cost is that
minus the stage work measured the same way (forward: the unrolled
forward; backward: the unrolled forward + backward, as the backward loop
recomputes; 1F1B: the mean of the two, its ticks alternating forward and
backward cells). Each time is the 10th
percentile of its rounds: on a shared machine other processes only add
time. The same child (K=4) also times the paper's consistency model (16
conv 3x3 1 -> 1, input [16, 8, 8, 1]) at K=4, T=8 and K=1, T=8 with the K=4
threads, for the ratio of the two.

`--tick_cost_repos` runs the same children on other checkouts (e.g. a git
worktree of an earlier commit), interleaved process by process, so before
and after come from one run. This file runs as a script in the child
(`python tick_cost.py '<json>'`) with the checkout under test first on
PYTHONPATH; it imports nothing from tools/ there.

Usage:
  python -m tools.benchmark --tick_cost
  python -m tools.benchmark --tick_cost --tick_cost_repos=/tmp/tick_base
"""

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

RESULT_PREFIX = 'TICK_COST_RESULT '
_MICRO_BATCH = 2
_DIM = 8


def _Child(request: Dict[str, Any]) -> Dict[str, Any]:
  """Measures one K in this process (TensorFlow not yet started)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorpipe import devices  # pylint: disable=g-import-not-at-top
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import linear  # pylint: disable=g-import-not-at-top

  class _Unrolled:
    """A layer run on T micro-batches in turn (as runner's plain-T<t>)."""

    def __init__(self, layer, num_micro_batches):
      self._layer, self._t = layer, num_micro_batches
      self.trainable_variables = layer.trainable_variables

    def FPropDefaultTheta(self, x):
      return tf.concat([self._layer.FPropDefaultTheta(mb)
                        for mb in tf.split(x, self._t, axis=0)], axis=0)

  k, ts, reps = request['k'], request['ts'], request['reps']
  consistency = request.get('consistency', False)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(max(k, 4) if
                                                      consistency else k)
  devices.SetNumLogicalCpuDevices(max(k, 4) if consistency else k)

  def StepFns(layer, x):
    variables = layer.trainable_variables

    def Forward(x):
      return tf.reduce_mean(tf.nest.flatten(layer.FPropDefaultTheta(x))[0])

    def Step(x):
      with tf.GradientTape() as tape:
        loss = Forward(x)
      grads = tape.gradient(loss, variables)
      for v, g in zip(variables, grads):
        v.assign_sub(1e-3 * g)
      return loss
    return (tf.function(Forward).get_concrete_function(x),
            tf.function(Step).get_concrete_function(x))

  def OneFOneBStep(layer, x):
    """The 1F1B training step (FPropLoss under a tape, as tasks run it)."""
    from tensorpipe import py_utils  # pylint: disable=g-import-not-at-top
    variables = layer.trainable_variables

    def LossSum(out, unused_targets):
      return tf.reduce_sum(out)

    def Step(x):
      with tf.GradientTape() as tape, py_utils.TrainingMode(True):
        loss = layer.FPropLoss(layer.theta, (x,), None, LossSum, 1.0).loss
      grads = tape.gradient(loss, variables)
      for v, g in zip(variables, grads):
        v.assign_sub(1e-3 * g)
      return loss
    return tf.function(Step).get_concrete_function(x)

  # Checkouts from before the 1F1B schedule time GPipe only.
  with_1f1b = 'schedule' in pipeline.TensorPipeLayer.Params()
  fns = {}
  for t in ts:
    for schedule in ('gpipe', '1f1b') if with_1f1b else ('gpipe',):
      layers = [linear.FCLayer.Params().Set(
          name=f'fc{i}', input_dim=_DIM, output_dim=_DIM, activation='RELU')
                for i in range(k)]
      p = pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', partitions=[[lp] for lp in layers],
          num_micro_batches=t)
      if with_1f1b:
        p.schedule = schedule
      layer = p.Instantiate()
      x = tf.random.stateless_uniform([_MICRO_BATCH * t, _DIM], seed=[1, 2])
      if schedule == '1f1b':
        fns[f'step_1f1b{t}'] = (OneFOneBStep(layer, x), x)
      else:
        fwd, step = StepFns(layer, x)
        fns[f'fwd{t}'] = (fwd, x)
        fns[f'step{t}'] = (step, x)
  # The stage work alone: the same K layers on the T micro-batches one after
  # another (Python-unrolled), no pipeline: what a tick costs beyond that
  # is the pipeline's fixed cost.
  for t in ts:
    layers = [linear.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=_DIM, output_dim=_DIM, activation='RELU')
              for i in range(k)]
    seq = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=layers).Instantiate()
    x = tf.random.stateless_uniform([_MICRO_BATCH * t, _DIM], seed=[1, 2])
    fwd, step = StepFns(_Unrolled(seq, t), x)
    fns[f'plain_fwd{t}'] = (fwd, x)
    fns[f'plain_step{t}'] = (step, x)
  if consistency:
    from models import consistency_cnn  # pylint: disable=g-import-not-at-top
    for ck in (1, 4):
      layer = consistency_cnn.ConsistencyPipeline(ck, 8).Instantiate()
      x = tf.random.stateless_uniform([16, 8, 8, 1], seed=[1, 2])
      fns[f'consistency_K{ck}_T8'] = (StepFns(layer, x)[1], x)
  for fn, x in fns.values():
    for _ in range(3):
      fn(x).numpy()
  times = {name: [] for name in fns}
  names = list(fns)
  for i in range(reps):
    for name in names[i % len(names):] + names[:i % len(names)]:
      fn, x = fns[name]
      start = time.perf_counter()
      fn(x).numpy()
      times[name].append(time.perf_counter() - start)
  # The 10th percentile: other processes on a shared machine only add time,
  # and a fixed cost is what is left without them.
  return {name: sorted(v)[len(v) // 10] for name, v in times.items()}


def RunChild(repo: str, k: int, ts: Sequence[int], reps: int,
             consistency: bool = False, timeout_s: float = 900
             ) -> Dict[str, float]:
  """Runs `_Child` on checkout `repo` in a fresh process.

  Returns:
    Per timed function, the 10th percentile of its step times (seconds).

  Raises:
    ValueError: `repo` is not a checkout (no tensorpipe/ folder).
    RuntimeError: the child failed (with its stderr tail).
  """
  if not os.path.isdir(os.path.join(repo, 'tensorpipe')):
    raise ValueError(f'tick-cost checkout {repo!r} has no tensorpipe/ folder; '
                     'give the root of a checkout of this repository')
  env = dict(os.environ)
  env['PYTHONPATH'] = repo
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  request = dict(k=k, ts=list(ts), reps=reps, consistency=consistency)
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), json.dumps(request)],
      capture_output=True, text=True, timeout=timeout_s, env=env, cwd=repo,
      check=False)
  for line in proc.stdout.splitlines():
    if line.startswith(RESULT_PREFIX):
      return json.loads(line[len(RESULT_PREFIX):])
  raise RuntimeError(f'tick-cost child (repo {repo!r}, K={k}) failed (exit '
                     f'{proc.returncode}):\n{proc.stderr[-3000:]}')


def PerTick(times: Dict[str, float], k: int, t_lo: int, t_hi: int
            ) -> Dict[str, float]:
  """Microseconds per tick per partition, from one child's times.

  Returns:
    forward_us / backward_us: what one more tick of the forward / backward
    loop costs, per partition; work_forward_us / work_backward_us: the
    stage's own kernels on one micro-batch (the unrolled model's forward;
    its forward + backward, since the backward loop recomputes); and
    fixed_forward_us / fixed_backward_us: the difference, the pipeline's
    fixed cost of a tick.
  """
  n = (t_hi - t_lo) * k

  def Diff(name):
    return (times[f'{name}{t_hi}'] - times[f'{name}{t_lo}']) / n * 1e6
  fwd = Diff('fwd')
  bwd = Diff('step') - fwd
  work_fwd = Diff('plain_fwd')
  work_bwd = Diff('plain_step')
  out = {'forward_us': fwd, 'backward_us': bwd,
         'work_forward_us': work_fwd, 'work_backward_us': work_bwd,
         'fixed_forward_us': fwd - work_fwd,
         'fixed_backward_us': bwd - work_bwd}
  if f'step_1f1b{t_hi}' in times:
    # 1F1B runs 2 (T + K - 1) ticks of one loop, each one cell per
    # partition: per micro-batch a forward tick and a backward tick (which
    # recomputes), i.e. the same stage work as GPipe's two ticks.
    tick = Diff('step_1f1b') / 2
    work = (work_fwd + work_bwd) / 2
    out.update(tick_1f1b_us=tick, work_1f1b_us=work,
               fixed_1f1b_us=tick - work)
  return out


def Measure(repos: Sequence[str], ks: Sequence[int] = (1, 2, 4),
            ts: Sequence[int] = (8, 32), reps: int = 200, rounds: int = 2,
            log=print) -> Dict[str, Any]:
  """Tick costs of each checkout in `repos`, child processes in turn.

  Returns:
    {repo: {'K<k>': PerTick(...) plus 'times' (seconds), 'consistency':
    {'K4_T8_s', 'K1_T8_s', 'K4_T8_over_K1_T8'}}}; per (repo, K) each time
    is the median over `rounds` processes of their 10th percentiles.
  """
  raw: Dict[str, Dict[int, List[Dict[str, float]]]] = {
      r: {k: [] for k in ks} for r in repos}
  for i in range(rounds):
    for k in ks:
      for repo in (repos if i % 2 == 0 else list(reversed(repos))):
        m = RunChild(repo, k, ts, reps, consistency=(k == max(ks)))
        log(f'round {i} {repo} K={k}: ' + ', '.join(
            f'{n} {v * 1e3:.2f} ms' for n, v in m.items()))
        raw[repo][k].append(m)
  out = {}
  for repo in repos:
    per_k = {}
    for k in ks:
      med = {n: statistics.median(m[n] for m in raw[repo][k])
             for n in raw[repo][k][0]}
      per_k[f'K{k}'] = dict(PerTick(med, k, min(ts), max(ts)), times=med)
      if 'consistency_K4_T8' in med:
        per_k['consistency'] = {
            'K4_T8_s': med['consistency_K4_T8'],
            'K1_T8_s': med['consistency_K1_T8'],
            'K4_T8_over_K1_T8': (med['consistency_K4_T8'] /
                                 med['consistency_K1_T8'])}
    out[repo] = per_k
  return out


def Table(results: Dict[str, Any], ks: Sequence[int] = (1, 2, 4)) -> str:
  """Markdown: per checkout and K, microseconds per tick per partition."""
  lines = ['| checkout | K | forward tick | stage work | fixed | backward '
           'tick | stage work | fixed |', '|---|---|---|---|---|---|---|---|']
  for repo, per_k in results.items():
    for k in ks:
      r = per_k[f'K{k}']
      lines.append(
          f'| {repo} | {k} | {r["forward_us"]:.1f} | '
          f'{r["work_forward_us"]:.1f} | {r["fixed_forward_us"]:.1f} | '
          f'{r["backward_us"]:.1f} | {r["work_backward_us"]:.1f} | '
          f'{r["fixed_backward_us"]:.1f} |')
  rows = [(repo, k, per_k[f'K{k}']) for repo, per_k in results.items()
          for k in ks if 'tick_1f1b_us' in per_k[f'K{k}']]
  if rows:
    lines += ['', '| checkout | K | 1F1B tick | stage work | fixed |',
              '|---|---|---|---|---|']
    lines += [f'| {repo} | {k} | {r["tick_1f1b_us"]:.1f} | '
              f'{r["work_1f1b_us"]:.1f} | {r["fixed_1f1b_us"]:.1f} |'
              for repo, k, r in rows]
  lines += ['', '| checkout | consistency K=4,T=8 ms | K=1,T=8 ms | ratio |',
            '|---|---|---|---|']
  for repo, per_k in results.items():
    c = per_k.get('consistency')
    if c:
      lines.append(f'| {repo} | {c["K4_T8_s"] * 1e3:.2f} | '
                   f'{c["K1_T8_s"] * 1e3:.2f} | {c["K4_T8_over_K1_T8"]:.2f} |')
  return '\n'.join(lines)


def _ChildMain(argv: List[str]) -> Optional[int]:
  # Run as a script: the checkout under test is on PYTHONPATH, not this
  # file's folder.
  sys.path.pop(0)
  sys.path.insert(0, os.getcwd())
  result = _Child(json.loads(argv[1]))
  sys.stdout.write(RESULT_PREFIX + json.dumps(result) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(_ChildMain(sys.argv))
