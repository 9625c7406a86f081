"""Tests of tensorpipe/peer_wait.py on 127.0.0.1 (no TensorFlow)."""

import socket
import time
import unittest

from tensorpipe import peer_wait


def _FreeAddress():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


class PeerWaitTest(unittest.TestCase):

  def testReturnsOnceEveryPeerAccepts(self):
    peer = peer_wait.Listen(_FreeAddress(), 'peer')
    self.addCleanup(peer.close)
    address = f'127.0.0.1:{peer.getsockname()[1]}'
    seconds = peer_wait.WaitForPeers(('worker[0]', _FreeAddress()),
                                     [('worker[1]', address)], 5.0, print)
    self.assertLess(seconds, 2.0)

  def testMissingPeerFailsNamingItAfterTheWaitWithProgressLines(self):
    lines = []
    missing = _FreeAddress()
    t0 = time.monotonic()
    with self.assertRaisesRegex(
        peer_wait.PeersMissingError,
        rf'^worker\[1\] at {missing} did not start within 0.5 s .*'
        r'--peer_wait_s$'):
      peer_wait.WaitForPeers(('worker[0]', _FreeAddress()),
                             [('worker[1]', missing)], 0.5, lines.append,
                             interval_s=0.2, poll_s=0.05)
    self.assertLess(time.monotonic() - t0, 2.0)
    self.assertTrue(lines)
    self.assertIn(f'worker[0]: waiting for worker[1] at {missing}', lines[0])

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
    peer_wait.WaitForPeers(('worker[0]', own), [], 1.0, print)
    self.assertFalse(peer_wait.Accepts(own))

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
