"""Starts R local worker processes of a multi-worker run and supervises them.

  python -m tools.launch --num_workers=2 -- \
      --model=image.fashion_mnist.ResNet4x8 --logdir=logs/r2
  bazel run //tools:launch -- --num_workers=2 -- --model=... --logdir=...

Everything after `--` is passed to every worker, `python -m tools.trainer
<flags>`. Worker r listens on 127.0.0.1:<port r> (free ports chosen by the
OS, or --port_base + r) and gets a TF_CONFIG naming all R workers and itself
as task r; worker 0 is the chief. Their output is streamed line by line with
a `[worker r]` prefix. If a worker fails, the others are ended (SIGTERM, then
SIGKILL after --grace_period_s) and the launcher exits with the failing
worker's exit code (128 + N for a worker killed by signal N); 0 if all
succeed. SIGINT / SIGTERM to the launcher end all workers the same way: a
trainer worker then finishes its step, the chief saves a checkpoint, and
every worker exits 143 with a "stopped by SIGTERM" line (the default grace,
60 s, covers a step and a checkpoint write; SIGKILL is for a hung worker).
The workers get SIGTERM if the launcher itself dies (Linux). With
--port_base the ports are checked before any worker starts.

On real hosts there is no launcher: start the same command on every host with
the TF_CONFIG that `tensorpipe.cluster.Cluster.ToTfConfig()` writes, e.g.
TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
"task": {"type": "worker", "index": 1}}' on host h1.
"""

import ctypes
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, List, Optional, Sequence

from absl import app
from absl import flags

from tensorpipe import preemption

_HOST = '127.0.0.1'
_POLL_S = 0.05


def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the launcher's flags (tests pass their own FlagValues)."""
  fv = flag_values
  flags.DEFINE_integer('num_workers', 2, 'R: worker processes to start, one '
                       'data-parallel replica each.', lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer('port_base', 0, 'Worker r listens on 127.0.0.1:'
                       'port_base + r; 0 picks free ports.', lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_float('grace_period_s', 60.0, 'Seconds between SIGTERM and '
                     'SIGKILL when ending workers: long enough for a step '
                     'and a checkpoint write (the trainer stops after its '
                     'step and saves on SIGTERM).', lower_bound=0.0,
                     flag_values=fv)
  flags.DEFINE_float('timeout_s', 0.0, 'End all workers and exit 124 after '
                     'this many seconds; 0 = no limit.', lower_bound=0.0,
                     flag_values=fv)
  flags.DEFINE_string('worker_module', 'tools.trainer', 'Python module each '
                      'worker runs with `python -m` (for tests and other '
                      'binaries; the default is the trainer).',
                      flag_values=fv)


def FreePorts(num: int, host: str = _HOST) -> List[int]:
  """`num` distinct ports the OS reports free on `host` (bound, then freed).

  Another process may take a port before the worker binds it; the worker then
  fails to start and the launcher reports it.
  """
  socks, ports = [], []
  try:
    for _ in range(num):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      socks.append(s)
      ports.append(s.getsockname()[1])
  finally:
    for s in socks:
      s.close()
  return ports


def WorkerPorts(num_workers: int, port_base: int = 0) -> List[int]:
  """Ports of the R workers: port_base + r, or free ports if port_base is 0."""
  if port_base == 0:
    return FreePorts(num_workers)
  last = port_base + num_workers - 1
  if port_base < 1024 or last > 65535:
    raise ValueError(f'--port_base={port_base} with {num_workers} workers '
                     f'needs ports {port_base}..{last}; use a base in '
                     f'1024..{65536 - num_workers}, or 0 for free ports')
  ports = [port_base + r for r in range(num_workers)]
  for r, port in enumerate(ports):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        s.bind((_HOST, port))
      except OSError as e:
        raise ValueError(f'port {port} of worker {r} (--port_base='
                         f'{port_base} + {r}) is not free ({e.strerror}); '
                         'stop the process that holds it, use another '
                         '--port_base, or 0 for free ports') from None
  return ports


def WorkerTfConfigs(ports: Sequence[int], host: str = _HOST) -> List[str]:
  """TF_CONFIG text of each worker: all on `host`, worker 0 the chief.

  Written here rather than with tensorpipe.cluster so that the launcher does
  not import TensorFlow (seconds per start); each worker parses and checks
  its TF_CONFIG with tensorpipe.cluster.
  """
  spec = {'worker': [f'{host}:{p}' for p in ports]}
  return [json.dumps({'cluster': spec, 'task': {'type': 'worker', 'index': r}})
          for r in range(len(ports))]


def _HowItEnded(returncode: int) -> str:
  """'failed with exit code 3', 'stopped by SIGTERM (exit code 143)' (the
  trainer's exit after a stop signal: 128 + N), 'was killed by SIGKILL'."""
  if returncode < 0:
    return f'was killed by {preemption.SignalName(-returncode)}'
  if returncode - 128 in preemption.STOP_SIGNALS:
    return (f'stopped by {preemption.SignalName(returncode - 128)} (exit '
            f'code {returncode})')
  return f'failed with exit code {returncode}'


def ExitCode(returncode: int) -> int:
  """A process's exit status as a shell reports it (signal N -> 128 + N)."""
  return preemption.ExitCode(-returncode) if returncode < 0 else returncode


@dataclasses.dataclass
class LaunchResult:
  """What `Launch` did.

  Attributes:
    exit_code: the launcher's exit code: the first failing worker's, 0 if
      all succeeded, 124 on timeout, 128 + N after signal N to the launcher.
    returncodes: each worker's Popen returncode (negative: killed by signal).
    failed_worker: index of the first worker that failed, or None.
    pids: the workers' process ids.
    reason: one line on how the run ended.
  """
  exit_code: int
  returncodes: List[int]
  failed_worker: Optional[int]
  pids: List[int]
  reason: str


class StopRequest:
  """Asks a running `Launch` to end all workers (safe from signal handlers)."""

  def __init__(self):
    self._event = threading.Event()
    self.exit_code = 0

  def Request(self, exit_code: int) -> None:
    """Ends the run; `Launch` then returns `exit_code`."""
    self.exit_code = exit_code
    self._event.set()

  def IsRequested(self) -> bool:
    return self._event.is_set()


def _SetParentDeathSignal() -> None:
  """In the child before exec: get SIGTERM when the launcher dies (Linux)."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1
  except (OSError, AttributeError):
    pass  # not Linux: the workers outlive a SIGKILLed launcher


class _Printer:
  """Writes whole lines from several threads to one stream."""

  def __init__(self, out: IO[str]):
    self._out = out
    self._lock = threading.Lock()

  def Line(self, prefix: str, text: str) -> None:
    with self._lock:
      try:
        self._out.write(f'{prefix} {text.rstrip(chr(10))}\n')
        self._out.flush()
      except (BrokenPipeError, ValueError):
        pass  # the reader went away; keep supervising


def _Stream(proc: subprocess.Popen, prefix: str, printer: _Printer) -> None:
  for raw in iter(proc.stdout.readline, b''):
    printer.Line(prefix, raw.decode('utf-8', errors='replace'))
  proc.stdout.close()


def _EndAll(procs: List[subprocess.Popen], grace_period_s: float,
            printer: _Printer) -> None:
  """SIGTERM to every live worker, SIGKILL to those alive after the grace."""
  live = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
  for r, p in live:
    printer.Line('[launch]', f'ending worker {r} (pid {p.pid}): SIGTERM')
    try:
      os.kill(p.pid, signal.SIGTERM)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + grace_period_s
  for r, p in live:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      printer.Line('[launch]', f'worker {r} (pid {p.pid}) still running '
                   f'{grace_period_s:g} s after SIGTERM: SIGKILL')
      try:
        os.kill(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def Launch(worker_args: Sequence[str], num_workers: int, port_base: int = 0,
           worker_module: str = 'tools.trainer', grace_period_s: float = 60.0,
           timeout_s: Optional[float] = None,
           stop: Optional['StopRequest'] = None,
           out: Optional[IO[str]] = None,
           env: Optional[dict] = None) -> LaunchResult:
  """Runs R workers `python -m worker_module *worker_args` to completion.

  Args:
    worker_args: arguments of every worker.
    num_workers: R.
    port_base: see WorkerPorts.
    worker_module: the module each worker runs.
    grace_period_s: SIGTERM-to-SIGKILL delay when ending workers.
    timeout_s: end everything after this long (exit code 124); None: never.
    stop: when requested (e.g. by a signal handler), end everything and
      return its exit code.
    out: where the prefixed lines go (default sys.stdout).
    env: the workers' environment before TF_CONFIG is added (default
      os.environ).

  Returns:
    A LaunchResult; no worker is alive when it returns.
  """
  printer = _Printer(sys.stdout if out is None else out)
  stop = stop or StopRequest()
  ports = WorkerPorts(num_workers, port_base)
  configs = WorkerTfConfigs(ports)
  base_env = dict(os.environ if env is None else env)
  base_env['PYTHONUNBUFFERED'] = '1'   # lines reach us as they are printed
  cmd = [sys.executable, '-m', worker_module, *worker_args]
  procs: List[subprocess.Popen] = []
  threads = []
  failed, exit_code, reason = None, 0, 'all workers exited with code 0'
  start = time.monotonic()
  try:
    for r in range(num_workers):
      procs.append(subprocess.Popen(
          cmd, env=dict(base_env, TF_CONFIG=configs[r]),
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, start_new_session=True,
          preexec_fn=_SetParentDeathSignal))
      printer.Line('[launch]', f'worker {r}: pid {procs[r].pid}, '
                   f'{_HOST}:{ports[r]}' + (' (chief)' if r == 0 else ''))
    for r, p in enumerate(procs):
      t = threading.Thread(target=_Stream, args=(p, f'[worker {r}]', printer),
                           daemon=True)
      t.start()
      threads.append(t)

    while True:
      codes = [p.poll() for p in procs]
      bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
      if bad:
        failed = bad[0]
        exit_code = ExitCode(codes[failed])
        reason = (f'worker {failed} (pid {procs[failed].pid}) '
                  f'{_HowItEnded(codes[failed])}')
        break
      if all(c == 0 for c in codes):
        break
      if stop.IsRequested():
        exit_code = stop.exit_code
        reason = f'stopped (exit code {exit_code} requested)'
        break
      if timeout_s and time.monotonic() - start > timeout_s:
        exit_code, reason = 124, f'timed out after {timeout_s:g} s'
        break
      time.sleep(_POLL_S)
  finally:
    # Also on an exception in the launcher itself: never leave a worker.
    if procs:
      if any(p.poll() is None for p in procs):
        printer.Line('[launch]', 'ending all workers' if failed is None
                     else 'ending the other workers')
      _EndAll(procs, grace_period_s, printer)
    for t in threads:
      t.join(timeout=5.0)
  printer.Line('[launch]', reason + f'; exit code {exit_code}')
  return LaunchResult(exit_code=exit_code,
                      returncodes=[p.returncode for p in procs],
                      failed_worker=failed, pids=[p.pid for p in procs],
                      reason=reason)


def main(argv: Sequence[str],
         flag_values: Optional[flags.FlagValues] = None) -> int:
  """Runs the workers; returns the exit code (see Launch)."""
  fv = flags.FLAGS if flag_values is None else flag_values
  stop = StopRequest()

  def OnSignal(signum, frame):
    del frame
    stop.Request(preemption.ExitCode(signum))

  old = {s: signal.signal(s, OnSignal) for s in preemption.STOP_SIGNALS}
  try:
    result = Launch(list(argv[1:]), fv.num_workers, port_base=fv.port_base,
                    worker_module=fv.worker_module,
                    grace_period_s=fv.grace_period_s,
                    timeout_s=fv.timeout_s or None, stop=stop)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  finally:
    for s, h in old.items():
      signal.signal(s, h)
  return result.exit_code


if __name__ == '__main__':
  DefineFlags()
  app.run(main)   # exits with main's return value
