"""A multi-worker trainer whose peer's port is held by another program.

Worker 0 of a 2-worker cluster, started alone on 127.0.0.1, where worker
1's port is held by (a bare listener, which accepts and never answers, is
refused in the peer wait: tests/peer_wait_test.py):

  a fake gRPC server (answers HTTP/2         TF's registration times out
  SETTINGS, never registers)                 after --peer_wait_s: the
                                              message names worker 1 and
                                              its address (exit 2)
  the same, SIGTERM during the registration  exit 143 with the stop line
                                              when TF's call returns, not
                                              rc 2 after the timeout

--peer_wait_s is 3: each run costs TensorFlow's import and a few seconds.
Every process runs under a timeout and is ended by its PID.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from tests.tools import tool_testlib

_WAIT_S = 3
_TIMEOUT_S = 120


def _FreePort():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class _Holder:
  """Holds a port: a bare listener, or answers like a gRPC server."""

  def __init__(self, grpc: bool):
    self.sock = socket.create_server(('127.0.0.1', 0))
    self.port = self.sock.getsockname()[1]
    self.conns = []
    if grpc:
      threading.Thread(target=self._Answer, daemon=True).start()

  def _Answer(self):
    while True:
      try:
        conn, _ = self.sock.accept()
        conn.sendall(b'\x00\x00\x00\x04\x00\x00\x00\x00\x00')  # SETTINGS
      except OSError:
        return
      self.conns.append(conn)  # open, silent: no registration

  def Close(self):
    self.sock.close()
    for c in self.conns:
      c.close()


class TrainerStartupTest(unittest.TestCase):

  def _Start(self, holder):
    logdir = tempfile.mkdtemp(prefix='trainer_startup_',
                              dir=os.environ.get('TEST_TMPDIR'))
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env.pop('TF_CONFIG', None)
    proc = subprocess.Popen(
        [sys.executable, '-m', 'tools.trainer',
         '--model=consistency.Consistency4x8', f'--logdir={logdir}',
         '--mode=train', f'--peer_wait_s={_WAIT_S}',
         f'--worker_hosts=127.0.0.1:{_FreePort()},127.0.0.1:{holder.port}',
         '--task_index=0'], cwd=tool_testlib.ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    self.addCleanup(self._End, proc)
    return proc

  @staticmethod
  def _End(proc):
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()

  def _Errors(self, proc):
    """(exit code, the trainer's own lines) once it ends."""
    _, err = proc.communicate(timeout=_TIMEOUT_S)
    return proc.returncode, [line for line in err.splitlines()
                             if line.startswith('trainer:')]

  def testAPeerThatNeverRegistersIsNamed(self):
    grpc = _Holder(grpc=True)
    self.addCleanup(grpc.Close)
    unregistered = self._Start(grpc)
    self.assertEqual(self._Errors(unregistered), (2, [
        f'trainer: error: worker[1] at 127.0.0.1:{grpc.port} accepts '
        f'connections but did not register within {_WAIT_S} s: is another '
        'program using that port (a worker of another run, a stale '
        'process)? Stop it or give the workers other ports and start every '
        'worker again, or wait longer with --peer_wait_s']))

  def testSigtermDuringTheRegistrationExits143(self):
    """TF's call holds the GIL and its preemption notifier takes SIGTERM:
    the signal, held by the trainer, acts when the call returns."""
    grpc = _Holder(grpc=True)
    self.addCleanup(grpc.Close)
    proc = self._Start(grpc)
    lines = []
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
      line = proc.stderr.readline()
      if not line:
        break
      lines.append(line)
      if 'every worker answers' in line:
        break
    self.assertIn('every worker answers', lines[-1], ''.join(lines))
    time.sleep(0.5)  # inside TF's registration now
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code, own = self._Errors(proc)
    self.assertEqual((code, own), (143, [
        'trainer: stopped by SIGTERM before the first step: nothing new to '
        'save; run the same command to resume']))
    # Held until TF's registration call returns (_WAIT_S), then the stop:
    # the exit code and line above are what a swallowed signal changes; the
    # bound only rules out a hang (shared machines: a wide margin).
    self.assertLess(time.monotonic() - sent, _WAIT_S + 30)


if __name__ == '__main__':
  unittest.main()
