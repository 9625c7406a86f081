"""Times TensorPipe against torch.distributed.pipelining on the same models.

For each built-in model (tools/benchmark's dense16, conv16), schedule, T and
recompute choice, one window runs, in turn:

  TensorPipe  tools/benchmark's child (benchmark_lib/spawn.py) for the
              setting K<k>-T<t>-<schedule>-<rc|norc> (`TensorPipeSetting`):
              one process, K logical CPU devices, 1 intra-op and K inter-op
              threads;
  torch       K processes on 127.0.0.1 (gloo), torch.set_num_threads(1)
              each, running tools/torch_peer_worker.py with --torch_python:
              the model cut into K v equal stages, torch's schedule class
              (torch_peer_worker.TORCH_SCHEDULES), recompute as
              torch.utils.checkpoint around each stage.

Both train with the mean of the last output as loss and SGD (lr 1e-3), take
the median step time of --steps steps after --warmup ones, and alternate
which goes first from one cell to the next. The table (markdown, also
torch_peer.md and torch_peer.json under --out) gives both step times, their
ratio and whether torch's per-rank compute order is TensorPipe's schedule
table (tensorpipe/schedule_builders) action for action.

torch is not a dependency of TensorPipe: give an interpreter that has it,

  python -m venv /tmp/torchenv && \
      /tmp/torchenv/bin/pip install torch==2.13.0 numpy absl-py
  python -m tools.torch_peer --models=dense16,conv16 --ts=4,8 \
      --recompute=off,on --steps=10 --out=benchmarks/out/torch_peer

Without one the tool exits with status 2 and that line.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Optional, Sequence

from absl import app
from absl import flags

from tensorpipe import schedule_builders
from tools import launch
from tools import paths
from tools import torch_peer_worker as worker
from tools.benchmark_lib import settings
from tools.benchmark_lib import spawn

FLAGS = flags.FLAGS
flags.DEFINE_list('models', ['dense16', 'conv16'], 'Built-in models of '
                  'tools/benchmark (settings.BUILTIN_MODELS).')
flags.DEFINE_list('schedules', list(worker.TORCH_SCHEDULES), 'TensorPipe '
                  'schedules, each timed against its torch class.')
flags.DEFINE_list('ts', ['4', '8'], 'Micro-batch counts T.')
flags.DEFINE_list('recompute', ['off'], "'off' (TensorPipe's -norc, torch "
                  "without checkpointing) and/or 'on' (-rc, torch.utils."
                  'checkpoint around each stage).')
flags.DEFINE_integer('num_partitions', 2, 'K: torch ranks, TensorPipe '
                     'devices.', lower_bound=2)
flags.DEFINE_integer('steps', 20, 'Timed steps per cell (median).',
                     lower_bound=1)
flags.DEFINE_integer('warmup', 3, 'Untimed steps first.', lower_bound=1)
flags.DEFINE_string('torch_python', '/tmp/torchenv/bin/python',
                    'Interpreter with torch (not a TensorPipe dependency).')
flags.DEFINE_integer('timeout_s', 300, 'Time limit of each child process.',
                     lower_bound=10)
flags.DEFINE_string('out', 'benchmarks/out/torch_peer', 'Output folder '
                    '(torch_peer.md, torch_peer.json).')

INSTALL_HINT = ('python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip '
                'install torch==2.13.0 numpy absl-py')
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'torch_peer_worker.py')
# Setting-name token of each schedule (tools/benchmark_lib/settings.py).
_TOKENS = {'gpipe': '', '1f1b': '1f1b-', 'interleaved_1f1b': 'i2-',
           'zb_h1': 'zbh1-', 'zb_v': 'zbv-'}


def TensorPipeSetting(schedule: str, num_partitions: int,
                      num_micro_batches: int, recompute: bool) -> str:
  """tools/benchmark's setting name, e.g. ('zb_v', 2, 8, False) ->
  'K2-T8-zbv-norc'."""
  if schedule not in _TOKENS:
    raise ValueError(f'schedule {schedule!r} has no torch peer; use one of '
                     f'{sorted(_TOKENS)}')
  return (f'K{num_partitions}-T{num_micro_batches}-{_TOKENS[schedule]}'
          f'{"rc" if recompute else "norc"}')


def TorchVersion(python: str) -> Optional[str]:
  """torch's version under `python`, or None where it cannot import it."""
  try:
    proc = subprocess.run(
        [python, '-c', 'import torch; print(torch.__version__)'],
        capture_output=True, text=True, timeout=120, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return None
  lines = proc.stdout.split()
  return lines[-1] if proc.returncode == 0 and lines else None


def RunTorch(python: str, request: Dict[str, Any], num_ranks: int,
             timeout_s: float) -> Dict[str, Any]:
  """Runs the ranks of torch_peer_worker; returns rank 0's result.

  Raises:
    RuntimeError: a rank failed or ran past `timeout_s` (every rank still
      running is then killed by its PID), with the last error lines.
  """
  request = dict(request, port=launch.FreePorts(1)[0])
  env = dict(os.environ, OMP_NUM_THREADS='1', WORLD_SIZE=str(num_ranks),
             MASTER_ADDR='127.0.0.1', MASTER_PORT=str(request['port']),
             GLOO_SOCKET_IFNAME='lo')
  with tempfile.TemporaryDirectory(prefix='torch_peer_') as tmp:
    procs, logs = [], []
    for rank in range(num_ranks):
      out = open(os.path.join(tmp, f'rank{rank}.out'), 'w+')
      err = open(os.path.join(tmp, f'rank{rank}.err'), 'w+')
      logs.append((out, err))
      procs.append(subprocess.Popen(
          [python, _WORKER, json.dumps(request)], stdout=out, stderr=err,
          env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), cwd=tmp))
    deadline = time.time() + timeout_s
    timed_out = False
    for p in procs:
      try:
        p.wait(timeout=max(0.1, deadline - time.time()))
      except subprocess.TimeoutExpired:
        timed_out = True
        break
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    texts = []
    for out, err in logs:
      out.seek(0)
      err.seek(0)
      texts.append((out.read(), err.read()))
      out.close()
      err.close()
  for line in texts[0][0].splitlines():
    if line.startswith(worker.RESULT_PREFIX) and not timed_out:
      return json.loads(line[len(worker.RESULT_PREFIX):])
  why = f'timed out after {timeout_s:.0f} s' if timed_out else (
      'exit ' + ', '.join(str(p.returncode) for p in procs))
  tails = [ErrorLine(err) for _, err in texts if err.strip()]
  raise RuntimeError(f'torch ranks failed ({why}): '
                     + (tails[0] if tails else 'no error output'))


def ErrorLine(text: str) -> str:
  """The last 'SomethingError: ...' line of a traceback, else its last
  line (torch's '[rank0]:' prefixes dropped)."""
  lines = [re.sub(r'^\[rank\d+\]:', '', ln).strip()
           for ln in text.splitlines()]
  lines = [ln for ln in lines if ln]
  errors = [ln for ln in lines if ln.split(':')[0].endswith(('Error',
                                                             'Exception'))]
  return (errors or lines or [''])[-1][:300]


def SameOrder(schedule: str, num_partitions: int, num_micro_batches: int,
              torch_orders: Sequence[Sequence[str]]) -> Optional[str]:
  """Compares torch's per-rank compute orders with TensorPipe's table.

  Returns:
    'yes' where every rank runs TensorPipe's actions
    (schedule_builders.Build(...).Orders()) in the same order, 'reordered'
    where the same actions in another order (GPipe: TensorPipe's backward
    runs the micro-batches last to first, torch's first to last), 'no'
    otherwise, None without orders.
  """
  if not torch_orders:
    return None
  ours = [[str(a) for a in row] for row in schedule_builders.Build(
      schedule, num_partitions, num_micro_batches,
      num_stages_per_device=worker.TORCH_SCHEDULES[schedule][1]).Orders()]
  theirs = [list(row) for row in torch_orders]
  if ours == theirs:
    return 'yes'
  if [sorted(r) for r in ours] == [sorted(r) for r in theirs]:
    return 'reordered'
  return 'no'


def _Ms(seconds: Optional[float]) -> str:
  return '-' if seconds is None else f'{seconds * 1e3:.1f}'


def Table(rows: Sequence[Dict[str, Any]]) -> str:
  """The markdown table of the cells (see `Run`'s rows)."""
  lines = ['| model | schedule (torch class) | T | recompute | TensorPipe ms '
           '| torch ms | TensorPipe / torch | same order |',
           '|---|---|---|---|---|---|---|---|']
  for r in rows:
    tp, th = r.get('tensorpipe_s'), r.get('torch_s')
    ratio = f'{tp / th:.2f}' if tp and th else '-'
    same = r.get('same_order') or '-'
    lines.append(f'| {r["model"]} | {r["schedule"]} ({r["torch_class"]}) | '
                 f'{r["T"]} | {"on" if r["recompute"] else "off"} | '
                 f'{_Ms(tp)} | {_Ms(th)} | {ratio} | {same} |')
  notes = [f'- {r["model"]} {r["schedule"]} T={r["T"]} {side}: {r[key]}'
           for r in rows for side, key in (('TensorPipe', 'tensorpipe_error'),
                                           ('torch', 'torch_error'))
           if r.get(key)]
  return '\n'.join(lines + ([''] + notes if notes else [])) + '\n'


def Summary(rows: Sequence[Dict[str, Any]]) -> str:
  """One line: how many cells TensorPipe is at most torch's step time."""
  ratios = [r['tensorpipe_s'] / r['torch_s'] for r in rows
            if r.get('tensorpipe_s') and r.get('torch_s')]
  if not ratios:
    return 'no cell has both step times'
  return (f'TensorPipe <= torch in {sum(x <= 1 for x in ratios)} of '
          f'{len(ratios)} cells; ratio median {statistics.median(ratios):.2f}'
          f', range {min(ratios):.2f} to {max(ratios):.2f}')


def _TensorPipeCell(model: str, setting: str) -> Dict[str, Any]:
  """Runs tools/benchmark's child for one setting (no baselines)."""
  try:
    r = spawn.RunSettingSubprocess(
        model, setting, timeout_s=FLAGS.timeout_s, steps=FLAGS.steps,
        warmup=FLAGS.warmup, partition_costs=False, pair_with=[])
  except (RuntimeError, subprocess.TimeoutExpired) as e:
    return {'tensorpipe_error': spawn.FailureReason(e)}
  return {'tensorpipe_s': r.step_time_s, 'tensorpipe_steps_s': r.step_times_s}


def _TorchCell(spec: Any, schedule: str, t: int,
               recompute: bool) -> Dict[str, Any]:
  request = dict(model=dict(layer=spec.layer, num_layers=spec.num_layers,
                            dim=spec.dim, batch=spec.batch,
                            image_size=spec.image_size),
                 schedule=schedule, num_micro_batches=t, recompute=recompute,
                 steps=FLAGS.steps, warmup=FLAGS.warmup, learning_rate=1e-3)
  try:
    r = RunTorch(FLAGS.torch_python, request, FLAGS.num_partitions,
                 FLAGS.timeout_s)
  except RuntimeError as e:
    return {'torch_error': str(e)}
  return {'torch_s': r['step_time_s'], 'torch_steps_s': r['step_times_s'],
          'orders': r['orders'],
          'same_order': SameOrder(schedule, FLAGS.num_partitions, t,
                                  r['orders'])}


def _Run(argv):
  del argv
  version = TorchVersion(FLAGS.torch_python)
  if version is None:
    print(f'{FLAGS.torch_python} cannot import torch (not a TensorPipe '
          f'dependency); get it with: {INSTALL_HINT}', file=sys.stderr)
    sys.exit(2)
  CheckModels(FLAGS.models)
  for s in FLAGS.schedules:
    if s not in worker.TORCH_SCHEDULES:
      raise app.UsageError(f'--schedules: {s!r} has no torch peer; use '
                           f'{",".join(worker.TORCH_SCHEDULES)}')
  if set(FLAGS.recompute) - {'on', 'off'} or not FLAGS.recompute:
    raise app.UsageError('--recompute takes off, on or off,on')
  try:
    ts = [int(t) for t in FLAGS.ts]
  except ValueError:
    raise app.UsageError(f'--ts={",".join(FLAGS.ts)} must be integers, e.g. '
                         '4,8') from None
  out = paths.UserPath(FLAGS.out)
  os.makedirs(out, exist_ok=True)
  load, started, rows = os.getloadavg()[0], time.time(), []
  cells = [(m, rc == 'on', s, t) for rc in FLAGS.recompute
           for m in FLAGS.models for t in ts for s in FLAGS.schedules]
  for i, (model, rc, schedule, t) in enumerate(cells):
    row = dict(model=model, schedule=schedule, T=t, recompute=rc,
               K=FLAGS.num_partitions,
               torch_class=worker.TORCH_SCHEDULES[schedule][0],
               setting=TensorPipeSetting(schedule, FLAGS.num_partitions, t,
                                         rc))
    spec = settings.BUILTIN_MODELS[model]
    sides = [lambda: _TensorPipeCell(model, row['setting']),
             lambda: _TorchCell(spec, schedule, t, rc)]
    for side in sides if i % 2 == 0 else sides[::-1]:
      row.update(side())
    print(Table([row]).splitlines()[2], flush=True)
    rows.append(row)
    # Written after every cell: an interrupted run keeps what it measured.
    header, text, summary = _Write(out, version, load, started, rows,
                                   len(cells))
  print()
  print(header)
  print()
  print(text)
  print(summary)
  print(f'wrote {os.path.join(out, "torch_peer.md")} and torch_peer.json')


def _Write(out: str, version: str, load: float, started: float,
           rows: Sequence[Dict[str, Any]], num_cells: int):
  """Writes torch_peer.md and torch_peer.json; returns (header, table,
  summary)."""
  text, summary, end_load = Table(rows), Summary(rows), os.getloadavg()[0]
  header = (f'torch {version}, K={FLAGS.num_partitions}, {FLAGS.steps} steps '
            f'(median) after {FLAGS.warmup}, {os.cpu_count()} CPUs, load '
            f'average {load:.2f} at start, {end_load:.2f} at the last cell, '
            f'{time.time() - started:.0f} s in all (one window); '
            f'{len(rows)} of {num_cells} cells')
  with open(os.path.join(out, 'torch_peer.md'), 'w') as f:
    f.write(f'{header}\n\n{text}\n{summary}\n')
  with open(os.path.join(out, 'torch_peer.json'), 'w') as f:
    json.dump(dict(torch_version=version, num_partitions=FLAGS.num_partitions,
                   steps=FLAGS.steps, warmup=FLAGS.warmup,
                   cpu_count=os.cpu_count(), load_average_at_start=load,
                   load_average_at_end=end_load,
                   wall_time_s=time.time() - started, num_cells=num_cells,
                   rows=rows), f, indent=1)
  return header, text, summary


def CheckModels(models: Sequence[str]) -> None:
  """Raises app.UsageError for a model the torch peer cannot build (the
  worker builds FC and conv3x3 layers of one width only), naming those it
  can."""
  twins = sorted(m for m, spec in settings.BUILTIN_MODELS.items()
                 if spec.layer in ('fc', 'conv3x3') and not spec.end_dim)
  for m in models:
    if m not in settings.BUILTIN_MODELS:
      raise app.UsageError(f'--models: {m!r} is not a built-in model; use '
                           f'one of {twins}')
    if m not in twins:
      raise app.UsageError(f'--models: {m!r} has no torch twin (the peer '
                           f'builds FC layers of one width and conv models '
                           f'only); use one of '
                           f'{twins}')


def main():
  app.run(_Run)


if __name__ == '__main__':
  main()
