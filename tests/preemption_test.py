"""Tests of tensorpipe/preemption.py: what a first and a second signal do."""

import io
import os
import signal
import threading
import unittest

from tensorpipe import preemption


class StopSignalsTest(unittest.TestCase):

  def _Stop(self):
    self.exits = []
    self.out = io.StringIO()
    stop = preemption.StopSignals(out=self.out, exit_fn=self.exits.append)
    stop.Install()
    self.addCleanup(stop.Uninstall)
    return stop

  def testSignalBeforeTheFirstStepExitsAtOnce(self):
    stop = self._Stop()
    os.kill(os.getpid(), signal.SIGTERM)
    self.assertEqual(self.exits, [143])
    self.assertFalse(stop.requested)
    self.assertIn('trainer: stopped by SIGTERM before the first step',
                  self.out.getvalue())

  def testTheUnarmedLineSaysWhatTheRunDoes(self):
    """--mode=eval never trains: its line must not speak of a first step."""
    exits, out = [], io.StringIO()
    stop = preemption.StopSignals(out=out, exit_fn=exits.append,
                                  unarmed='during --mode=eval: ...')
    stop.Install()
    self.addCleanup(stop.Uninstall)
    os.kill(os.getpid(), signal.SIGINT)
    self.assertEqual(exits, [130])
    self.assertEqual(out.getvalue(),
                     'trainer: stopped by SIGINT during --mode=eval: ...\n')

  def testArmedSignalAsksForAStopAndASecondExitsAtOnce(self):
    stop = self._Stop()
    stop.Arm()
    os.kill(os.getpid(), signal.SIGINT)
    self.assertEqual(self.exits, [])
    self.assertTrue(stop.requested)
    self.assertEqual(stop.signum, signal.SIGINT)
    self.assertIn('SIGINT received: finishing the current step',
                  self.out.getvalue())
    os.kill(os.getpid(), signal.SIGTERM)
    self.assertEqual(self.exits, [143])
    self.assertIn('second signal (SIGTERM): exiting at once',
                  self.out.getvalue())

  def testHeldSignalWaitsForReleaseAndLaterThreadsNeverTakeIt(self):
    """What the trainer does around a cluster's registration, where TF's
    C++ call holds the GIL and its preemption notifier replaces the
    handler: a thread started while held (as TF's are) blocks the signals
    too, and a signal sent meanwhile acts on Release."""
    stop = self._Stop()
    stop.Hold()
    self.addCleanup(stop.Release)
    masks = []
    thread = threading.Thread(target=lambda: masks.append(
        signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    thread.start()
    thread.join()
    self.assertLessEqual({signal.SIGTERM, signal.SIGINT}, masks[0])
    # To this thread: pytest's timeout thread would take a signal sent to
    # the process (in the trainer, every thread is started while held).
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    self.assertEqual(self.exits, [])
    self.assertIn(signal.SIGTERM, signal.sigpending())
    stop.Release()
    self.assertEqual(self.exits, [143])
    self.assertNotIn(signal.SIGTERM, signal.pthread_sigmask(signal.SIG_BLOCK,
                                                            []))

  def testUninstallRestoresTheHandlers(self):
    before = signal.getsignal(signal.SIGTERM)
    stop = preemption.StopSignals(exit_fn=lambda code: None).Install()
    self.assertNotEqual(signal.getsignal(signal.SIGTERM), before)
    stop.Uninstall()
    self.assertEqual(signal.getsignal(signal.SIGTERM), before)

  def testStopRequestedLineAndExitCode(self):
    e = preemption.StopRequested(signal.SIGTERM, 7, '/l/checkpoints/ckpt-7')
    self.assertEqual(str(e), 'stopped by SIGTERM at step 7; saved ckpt-7; '
                     'run the same command to resume')
    self.assertEqual(e.exit_code, 143)
    self.assertEqual(preemption.StopRequested(signal.SIGINT, 3,
                                              None).exit_code, 130)
    other = preemption.StopRequested(None, 3, None)
    self.assertEqual(other.exit_code, 143)
    self.assertIn("another worker's stop signal", str(other))


class StopAgreedTest(unittest.TestCase):

  def testStopVoteStopsEveryWorkerAfterTheSameStep(self):
    """With other processes only the step's all-reduced votes decide; in
    one process the request itself (trainer_lib_test checks that the step
    sums the votes)."""
    agreed = preemption.StopAgreed
    # votes, requested here, R, local R -> stop
    for votes, requested, r, local, stop in (
        (1.0, False, 2, 1, True),    # the other worker was signalled
        (2.0, True, 2, 1, True),     # both
        (0.0, False, 2, 1, False),   # nobody
        (0.0, True, 2, 1, False),    # asked after this step's vote: next
        (0.0, True, 2, 2, True),     # one process: the request itself
        (0.0, False, 1, 1, False)):
      self.assertEqual(agreed(votes, requested, r, local), stop,
                       (votes, requested, r, local))


if __name__ == '__main__':
  unittest.main()
