"""Tests of tensorpipe/peer_wait.py on 127.0.0.1 (no TensorFlow)."""

import socket
import threading
import time
import unittest

from tensorpipe import peer_wait


def _FreeAddress():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


def _Within(seconds, fn, *args, **kwargs):
  """fn's result or exception, from a thread given `seconds`: a wait whose
  timeout is broken fails the test in seconds instead of hanging it."""
  out = {}

  def Run():
    try:
      out['result'] = fn(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      out['error'] = e
  thread = threading.Thread(target=Run, daemon=True)
  thread.start()
  thread.join(seconds)
  if thread.is_alive():
    raise AssertionError(f'{fn.__name__} still running after {seconds} s')
  return out


class _FakeGrpcServer:
  """Answers every connection with an HTTP/2 SETTINGS frame, as TF's gRPC
  server does, or with `answer`."""

  def __init__(self, answer=b'\x00\x00\x00\x04\x00\x00\x00\x00\x00'):
    self.sock = socket.create_server(('127.0.0.1', 0))
    self.address = f'127.0.0.1:{self.sock.getsockname()[1]}'
    self._answer = answer
    threading.Thread(target=self._Run, daemon=True).start()

  def _Run(self):
    while True:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      with conn:
        conn.sendall(self._answer)

  def close(self):
    self.sock.close()


class PeerWaitTest(unittest.TestCase):

  def testReturnsOnceEveryPeerAnswersAsAWorker(self):
    """Two workers waiting for each other both return; a TF server (HTTP/2
    SETTINGS) counts as a worker."""
    a, b = _FreeAddress(), _FreeAddress()
    grpc = _FakeGrpcServer()
    self.addCleanup(grpc.close)
    other = threading.Thread(
        target=peer_wait.WaitForPeers,
        args=(('worker[1]', b), [('worker[0]', a)], 5.0, print), daemon=True)
    other.start()
    seconds = peer_wait.WaitForPeers(
        ('worker[0]', a), [('worker[1]', b), ('worker[2]', grpc.address)],
        5.0, print)
    self.assertLess(seconds, 2.0)
    other.join(5.0)
    self.assertFalse(other.is_alive())
    self.assertEqual(peer_wait.Probe(grpc.address), peer_wait.WORKER)

  def testMissingPeerFailsNamingItAfterTheWaitWithProgressLines(self):
    lines = []
    missing = _FreeAddress()
    t0 = time.monotonic()
    out = _Within(5, peer_wait.WaitForPeers, ('worker[0]', _FreeAddress()),
                  [('worker[1]', missing)], 0.5, lines.append,
                  interval_s=0.2, poll_s=0.05)
    self.assertIsInstance(out.get('error'), peer_wait.PeersMissingError)
    self.assertRegex(str(out['error']),
                     rf'^worker\[1\] at {missing} did not start within 0.5 '
                     r's .*--peer_wait_s$')
    # Ends soon after the 0.5 s wait (probes of a closed port are refused
    # at once); the bound itself is asserted exactly on an injected clock
    # below, so this one leaves a shared machine's scheduling a margin.
    self.assertLess(time.monotonic() - t0, 4.0)
    self.assertTrue(lines)
    self.assertIn(f'worker[0]: waiting for worker[1] at {missing}', lines[0])

  def testTheTimeoutBoundsTheWaitOnAnInjectedClock(self):
    """The bound itself, without waiting: the clock jumps 10 s per round;
    a wait of 25 s ends after the round that passes it (3 probes)."""
    now = [0.0]
    probes = []

    def Probe(address):
      probes.append(address)
      now[0] += 10.0
      return peer_wait.REFUSED
    out = _Within(5, peer_wait.WaitForPeers, ('worker[0]', _FreeAddress()),
                  [('worker[1]', '127.0.0.1:1')], 25.0, print, probe=Probe,
                  clock=lambda: now[0], sleep=lambda _: None)
    self.assertIsInstance(out.get('error'), peer_wait.PeersMissingError)
    self.assertEqual(len(probes), 3)

  def testAnotherProgramOnAPeersPortIsNamed(self):
    """A port held by a bare listener (or anything that answers otherwise)
    passes a TCP probe but would never register with TF: named after the
    wait, with what to check; the missing one in the same line."""
    bare = peer_wait.Listen(_FreeAddress(), 'bare')
    self.addCleanup(bare.close)
    web = _FakeGrpcServer(b'HTTP/1.1 400 Bad Request\r\n\r\n')
    self.addCleanup(web.close)
    held = f'127.0.0.1:{bare.getsockname()[1]}'
    self.assertEqual(peer_wait.Probe(held, timeout_s=0.2), peer_wait.OTHER)
    self.assertEqual(peer_wait.Probe(web.address), peer_wait.OTHER)
    missing = _FreeAddress()
    out = _Within(10, peer_wait.WaitForPeers, ('worker[0]', _FreeAddress()),
                  [('worker[1]', held), ('worker[2]', missing),
                   ('worker[3]', web.address)], 1.0, print)
    self.assertEqual(
        str(out.get('error')),
        f'worker[2] at {missing} did not start within 1 s (no connection '
        'accepted): start every worker with the same cluster, or wait '
        f'longer with --peer_wait_s; worker[1] at {held}, worker[3] at '
        f'{web.address} accepts connections but did not answer as a '
        'TensorPipe worker within 1 s: is another program using that port? '
        "Stop it, or give that worker another port in every worker's "
        'cluster')

  def testOwnPortInUseIsNamed(self):
    busy = peer_wait.Listen(_FreeAddress(), 'other')
    self.addCleanup(busy.close)
    port = busy.getsockname()[1]
    with self.assertRaisesRegex(
        peer_wait.PortInUseError,
        rf'port {port} of worker\[1\] \(127.0.0.1:{port}\) is already in '
        'use'):
      peer_wait.WaitForPeers(('worker[1]', f'127.0.0.1:{port}'), [], 1.0,
                             print)

  def testTheListenerIsClosedAfterTheWait(self):
    own = _FreeAddress()
    before = set(threading.enumerate())
    peer_wait.WaitForPeers(('worker[0]', own), [], 1.0, print)
    self.assertFalse(peer_wait.Accepts(own))
    # The answerer joined. (Not a thread count: another test's bounded
    # thread may end meanwhile.)
    self.assertEqual([t.name for t in threading.enumerate()
                      if t not in before], [])

  def testWaitForExitReturnsThePeersStillUp(self):
    up = peer_wait.Listen(_FreeAddress(), 'up')
    self.addCleanup(up.close)
    address = f'127.0.0.1:{up.getsockname()[1]}'
    self.assertEqual(peer_wait.WaitForExit(
        [('worker[1]', address), ('worker[2]', _FreeAddress())], 0.3),
                     ['worker[1]'])
    up.close()
    self.assertEqual(peer_wait.WaitForExit([('worker[1]', address)], 1.0),
                     [])


if __name__ == '__main__':
  unittest.main()
