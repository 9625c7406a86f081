"""Stages in other processes: the step and the transfer floor
(tools/benchmark --remote_check).

With `distribute.ConnectRemoteStages` a pipeline's K stages run in K TF
servers (`tf.distribute.Server`, one process each: the multi-host path)
driven by one client process; every boundary activation and gradient then
crosses TF's gRPC runtime. This module measures what that costs:

* `StartServers` / `StopServers`: K servers on 127.0.0.1 (thread pools
  as the client's config says), every process ended by its process group
  and by its parent's exit.
* `TransferFloor` (run in a fresh client process): the time of one
  transfer of a tensor of a given shape from server 0 to server 1 and back,
  as a tf.while_loop of round trips inside one tf.function (no client
  round trip per transfer), against the same loop between two logical
  devices of one process. That is the floor under each boundary crossing
  of a pipelined step.
* The pipelined step itself runs through `runner.RunSetting(...,
  remote_workers=...)`: the same model and setting, its stages on the
  servers.

A step of K=2, T micro-batches crosses the boundary 2T times (T forward
activations, T gradients); the floor times that is the transfers' serial
latency (a step can overlap some of it with compute).

Usage (parent):
  procs, addresses = remote.StartServers(2)
  try:
    r = spawn.RunSettingSubprocess('dense16', 'K2-T8-1f1b-rc',
                                   remote_workers=addresses, ...)
    floor = remote.TransferFloorSubprocess(addresses, [[8, 1024]])
  finally:
    remote.StopServers(procs)
"""

import dataclasses
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence, Tuple

from tools import launch
from tools.benchmark_lib import settings
from tools.benchmark_lib import spawn

# A server. The functions it runs for the client use the thread pools of
# the client's config, which connect_to_cluster sends (runner.RunSetting's:
# one intra-op thread, K inter-op threads); its own config (one and one)
# sizes the rest: without it, conv16 K2-T8-1f1b-rc took 145-153 ms across
# two servers instead of 115. It exits when its parent does (the watchdog
# on stdin), so no server outlives the benchmark.
_SERVER = '''
import os
import sys
import threading
import tensorflow as tf
def Watch():
  sys.stdin.read()
  os._exit(0)
threading.Thread(target=Watch, daemon=True).start()
workers = sys.argv[1].split(",")
config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                  inter_op_parallelism_threads=1)
server = tf.distribute.Server(
    tf.train.ClusterSpec({"worker": workers}), job_name="worker",
    task_index=int(sys.argv[2]), config=config, start=True)
print("ready", flush=True)
server.join()
'''
_START_TIMEOUT_S = 120
FLOOR_PREFIX = 'TRANSFER_FLOOR '
_CHILD = ('from tools.benchmark_lib import remote; '
          'remote.TransferFloorMain()')


def StartServers(num: int, timeout_s: float = _START_TIMEOUT_S
                 ) -> Tuple[List[subprocess.Popen], List[str]]:
  """Starts `num` TF servers on 127.0.0.1; (processes, 'host:port' each).

  Raises:
    RuntimeError: a server did not print 'ready' within `timeout_s` (its
      stderr tail in the message); every server is stopped first, as on
      any other error or an interrupt while they start.
  """
  addresses = [f'127.0.0.1:{p}' for p in launch.FreePorts(num)]
  env = dict(os.environ, CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  procs = []
  try:
    for i in range(num):
      err = tempfile.TemporaryFile()
      proc = subprocess.Popen(
          [sys.executable, '-c', _SERVER, ','.join(addresses), str(i)],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
          env=env, start_new_session=True)
      proc.err_file = err
      procs.append(proc)
    deadline = time.time() + timeout_s
    for i, proc in enumerate(procs):
      line = b''
      ready, _, _ = select.select([proc.stdout], [], [],
                                  max(0.0, deadline - time.time()))
      if ready:
        line = proc.stdout.readline()
      if b'ready' not in line:
        proc.err_file.seek(0)
        tail = proc.err_file.read().decode(errors='replace')[-2000:]
        raise RuntimeError(
            f'TF server {i} of {addresses} did not start within '
            f'{timeout_s:.0f} s (printed {line!r}); its stderr:\n{tail}')
  except BaseException:
    StopServers(procs)
    raise
  return procs, addresses


def StopServers(procs: Sequence[subprocess.Popen]) -> None:
  """Kills every server's process group, then waits for each."""
  for proc in procs:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  for proc in procs:
    proc.wait(timeout=30)
    for f in (proc.stdin, proc.stdout, getattr(proc, 'err_file', None)):
      if f is not None:
        f.close()


def _RoundTrips(devices: Sequence[str], shape: Sequence[int], reps: int,
                rounds: int) -> float:
  """Median seconds of one transfer devices[0] -> devices[1] (half a
  round trip), from `reps` round trips in a tf.while_loop, over `rounds`."""
  import statistics  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.device(devices[0]):
    x0 = tf.ones(shape)

  @tf.function(autograph=False)
  def Loop(x):
    def Body(i, x):
      # Ops Grappler cannot fold away (x * 1.0 it removes, and with it
      # the transfer); the values stay near 1.
      with tf.device(devices[1]):
        y = x + 1.0
      with tf.device(devices[0]):
        z = y * 0.5
      return i + 1, z
    with tf.device(devices[0]):  # the loop's control, as the engine's
      return tf.while_loop(lambda i, x: i < reps, Body,
                           (tf.constant(0), x), parallel_iterations=1)[1]

  def Time():
    start = time.perf_counter()
    Loop(x0).numpy()
    return time.perf_counter() - start
  Time()
  times = [Time() for _ in range(rounds)]
  return statistics.median(times) / (2 * reps)


def TransferFloor(addresses: Sequence[str], shapes: Sequence[Sequence[int]],
                  reps: int = 200, rounds: int = 5) -> List[Dict[str, Any]]:
  """Per shape (float32), seconds per transfer between two servers and
  between two logical devices of this process. Call in a fresh process
  (it connects to the servers and sets up 2 logical CPU devices)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorpipe import devices as devices_lib  # pylint: disable=g-import-not-at-top
  from tensorpipe import distribute  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(2)
  devices_lib.SetNumLogicalCpuDevices(2)
  remote_devices = distribute.ConnectRemoteStages(list(addresses))
  local = ['/job:localhost/replica:0/task:0/device:CPU:0',
           '/job:localhost/replica:0/task:0/device:CPU:1']
  out = []
  for shape in shapes:
    out.append(dict(
        shape=list(shape), bytes=4 * math.prod(shape),
        remote_s=_RoundTrips(remote_devices, shape, reps, rounds),
        local_s=_RoundTrips(local, shape, reps, rounds)))
  return out


def TransferFloorMain() -> None:
  """Child entry point: argv[1] is JSON {addresses, shapes}."""
  request = json.loads(sys.argv[1])
  rows = TransferFloor(request['addresses'], request['shapes'])
  print(FLOOR_PREFIX + json.dumps(rows), flush=True)


def TransferFloorSubprocess(addresses: Sequence[str],
                            shapes: Sequence[Sequence[int]],
                            timeout_s: float = 600) -> List[Dict[str, Any]]:
  """`TransferFloor` in a fresh client process.

  Raises:
    RuntimeError: the child failed (its stderr tail in the message).
  """
  return spawn.RunJsonChild(
      _CHILD, {'addresses': list(addresses),
               'shapes': [list(s) for s in shapes]},
      FLOOR_PREFIX, timeout_s, 'the transfer floor child',
      {'CUDA_VISIBLE_DEVICES': ''})


def BoundaryShape(model_shape: Sequence[int], num_micro_batches: int
                  ) -> List[int]:
  """A micro-batch's boundary activation of a built-in model whose layers
  keep the input's shape (fc, conv3x3, xfmr): the input with N / T rows."""
  if model_shape[0] % num_micro_batches:
    raise ValueError(f'batch {model_shape[0]} is not divisible by '
                     f'T={num_micro_batches}')
  return [model_shape[0] // num_micro_batches] + list(model_shape[1:])


def _Key(row: Dict[str, Any]) -> Tuple[str, str, str]:
  """(model, 'K<k>', 'T<t>') of a row."""
  k, t = row['setting'].split('-')[:2]
  return row['model'], k, t


def Table(rows: Sequence[Dict[str, Any]]) -> str:
  """Markdown table of --remote_check rows; 'over 1F1B' compares each
  setting's two-process step (and its 'separate' predictions, without and
  with the measured transfers) with that of the 1F1B setting of the same
  model, K and T in the rows, if any. CPU: per step over the timed rounds
  (runner.RunSetting's cpu_s, pid_cpu_s), and that over the median step:
  the cores kept busy."""
  out = ['| model | setting | in process ms | two processes ms | ratio | '
         'predicted (separate) ms, without / with transfers | over 1F1B '
         'measured / predicted without / with | boundary | transfer µs '
         '(servers / in process) | crossings | floor ms | extra ms | CPU ms '
         'per step, one process / client + servers | cores busy (CPU per '
         'step / median step), one process / two processes |',
         '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  ones = {_Key(r): r for r in rows if '-1f1b-' in r['setting']}
  keys = ('predicted_separate_s', 'predicted_transfers_s')
  for r in rows:
    preds = [r.get(k) for k in keys]
    base = ones.get(_Key(r))
    over = ''
    if base is not None:
      over = ' / '.join(
          [f'{r["remote_step_s"] / base["remote_step_s"]:.3f}'] +
          [f'{p / base[k]:.3f}' for p, k in zip(preds, keys)
           if p and base.get(k)])
    cells = [
        r['model'], r['setting'], f'{r["local_step_s"] * 1e3:.1f}',
        f'{r["remote_step_s"] * 1e3:.1f}',
        f'{r["remote_step_s"] / r["local_step_s"]:.2f}',
        ' / '.join(f'{p * 1e3:.1f}' for p in preds if p), over,
        'x'.join(str(n) for n in r['shape']),
        f'{r["remote_s"] * 1e6:.0f} / {r["local_s"] * 1e6:.0f}',
        str(r['crossings']),
        f'{r["crossings"] * r["remote_s"] * 1e3:.1f}',
        f'{(r["remote_step_s"] - r["local_step_s"]) * 1e3:.1f}']
    local_cpu, remote_cpu = r.get('local_cpu_s'), r.get('remote_cpu_s')
    if local_cpu is not None and remote_cpu and None not in remote_cpu:
      cells += [
          f'{local_cpu * 1e3:.1f} / ' + ' + '.join(
              f'{c * 1e3:.1f}' for c in remote_cpu),
          f'{local_cpu / r["local_step_s"]:.2f} / '
          f'{sum(remote_cpu) / r["remote_step_s"]:.2f}']
    else:
      cells += ['', '']
    out.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(out)


def Crossings(setting) -> int:
  """Boundary crossings between devices per step of a pipelined setting:
  per micro-batch, one activation and one gradient over each stage
  boundary whose two stages sit on different devices."""
  place = settings.ScheduleTable(setting).StageDevice()
  cuts = sum(1 for s in range(len(place) - 1) if place[s] != place[s + 1])
  return 2 * cuts * setting.num_micro_batches


def SeparatePrediction(setting, profile_json: Dict[str, Any],
                       cut: Sequence[Sequence[int]],
                       transfer_s: float = 0.0,
                       boundary_bytes: float = 0.0) -> float:
  """The calibrated cost model's step of `setting` with each device its
  own executor (`cost_model.Predict(..., 'separate')`: the table's
  dataflow with its bubbles), from a profile of the setting's layer
  (`plan_check.ProfileChild`) cut at `cut`. With `transfer_s`, the
  measured time of one crossing of a boundary tensor of `boundary_bytes`
  between the servers (`TransferFloor`) is the profile's transfer cost
  (every boundary of a built-in model has that shape), added to each cell
  that sends or receives one; else the profile's own (in process)."""
  from tensorpipe import cost_model  # pylint: disable=g-import-not-at-top
  profile = cost_model.Profile.FromJson(profile_json)
  if transfer_s:
    if boundary_bytes <= 0:
      raise ValueError(f'boundary_bytes={boundary_bytes!r} must be > 0 with '
                       f'transfer_s={transfer_s!r}: pass the bytes of the '
                       "tensor the transfer was timed on (TransferFloor's "
                       "'bytes')")
    profile = dataclasses.replace(
        profile, transfer_s_per_byte=transfer_s / boundary_bytes)
  return cost_model.Predict(settings.ScheduleTable(setting), profile,
                            [tuple(c) for c in cut], setting.recompute,
                            'separate').step_s
