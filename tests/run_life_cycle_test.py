"""Tests of tensorpipe/run_life_cycle.py: start and finish in one process.

Every side effect is a fake that records its step (the coordination store
is an in-memory dict); the subprocess tests of tools/trainer.py run the
real ones.
"""

import io
import json
import signal
import threading
import unittest

import tensorflow as tf

from tensorpipe import cluster as cluster_lib
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import peer_wait
from tensorpipe import preemption
from tensorpipe import run_life_cycle
from tensorpipe import worker_agreement

_FLAGS = {'--seed': '1234', '--mode': 'train'}


def _Params(max_steps=10):
  p = hyperparams.Params()
  p.Define('name', 'Exp', 'The experiment.')
  p.Define('max_steps', max_steps, 'Steps to train.')
  return p


class _Store:
  """An in-memory coordination store; Get of a missing key times out."""

  def __init__(self, events):
    self.values = {}
    self._events = events

  def Set(self, key, value):
    self._events.append(f'set {key}')
    self.values[key] = value

  def Get(self, key, timeout_s):
    self._events.append(f'get {key}')
    if key not in self.values:
      raise TimeoutError(f'{key} not set within {timeout_s} s')
    return self.values[key]


class _Lock:

  def __init__(self, events, error=None):
    self.held = False
    self._events = events
    self._error = error

  def Acquire(self):
    self._events.append('lock')
    if self._error:
      raise self._error
    self.held = True

  def Release(self):
    if self.held:
      self._events.append('unlock')
    self.held = False


def _Digests(params, flags):
  return json.dumps(worker_agreement.KeyDigests(params.ToText(), flags),
                    sort_keys=True)


class RunLifeCycleTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.events = []
    self.exits = []
    self.out = io.StringIO()
    self.stop = preemption.StopSignals(out=self.out,
                                       exit_fn=self.exits.append).Install()
    self.addCleanup(self.stop.Uninstall)
    self.addCleanup(self.stop.Release)
    self.store = _Store(self.events)
    self.lock = _Lock(self.events)

  def _Steps(self, **kw):
    def WaitForPeers(own, peers, timeout_s, log):
      del log  # unused
      self.events.append(f'peers {own[0]} -> {[t[0] for t in peers]} '
                         f'({timeout_s:g} s)')
      return 0.5

    def MakeTopology(num_replicas, num_partitions, cluster, timeouts):
      self.events.append(
          f'topology R={num_replicas} K={num_partitions} '
          f'cluster={cluster is not None} register_timeout_s='
          f'{getattr(timeouts, "cluster_register_timeout_s", None)}')
      return 'topology'

    def WaitForExit(peers, timeout_s):
      self.events.append(f'wait for exit {[t[0] for t in peers]} '
                         f'({timeout_s:g} s)')
      return []

    def Exit(code):
      self.events.append(f'exit {code}')

    steps = dict(wait_for_peers=WaitForPeers, make_topology=MakeTopology,
                 wait_for_exit=WaitForExit, store=self.store, exit_fn=Exit)
    steps.update(kw)
    return run_life_cycle.Steps(**steps)

  def _Life(self, worker_index=0, num_workers=2, steps=None, lock=None,
            take_lock=True):
    cluster = None
    if num_workers > 1:
      cluster = cluster_lib.Cluster(
          workers=tuple(f'127.0.0.1:{2000 + i}' for i in range(num_workers)),
          task_type='worker', task_index=worker_index)
    return run_life_cycle.RunLifeCycle(
        '/no/such/logdir', cluster, self.stop, take_lock=take_lock,
        peer_wait_s=7.0, log=lambda line: self.events.append(f'log {line}'),
        warn=lambda line: self.events.append(f'warn {line}'),
        lock=lock or self.lock, steps=steps or self._Steps())

  def _Start(self, life, params=None, flags=None):
    return life.Start(params or _Params(), 2, 1, flags or _FLAGS,
                      lambda: self.events.append('devices'))

  def testChiefStartsAndFinishesInOrder(self):
    self.store.values['tensorpipe/worker_agreement/1'] = _Digests(
        _Params(), _FLAGS)
    life = self._Life(worker_index=0)
    self.assertEqual(self._Start(life), 'topology')
    self.assertTrue(self.lock.held)
    life.Finish(0)
    self.assertEqual(self.events, [
        'lock',
        'devices',
        "peers worker[0] -> ['worker[1]'] (7 s)",
        'log worker[0]: every worker answers (0.5 s)',
        'topology R=1 K=2 cluster=True register_timeout_s=7.0',
        'set tensorpipe/worker_agreement/0',
        'get tensorpipe/worker_agreement/1',
        # Finish
        'set tensorpipe/trainer/chief_done',
        "wait for exit ['worker[1]'] (30 s)",
        'unlock',
        # At once: the service would call a gone worker unhealthy.
        'exit 0'])
    life.Unlock()  # idempotent: the binary's finally
    self.assertEqual(self.events.count('unlock'), 1)

  def testWorkerTakesNoLockAndLeavesAfterTheChief(self):
    self.store.values['tensorpipe/worker_agreement/0'] = _Digests(
        _Params(), _FLAGS)
    self.store.values[run_life_cycle.CHIEF_DONE_KEY] = '1'
    life = self._Life(worker_index=1)
    self._Start(life)
    life.Finish(143)
    self.assertEqual(self.events, [
        'devices',
        "peers worker[1] -> ['worker[0]'] (7 s)",
        'log worker[1]: every worker answers (0.5 s)',
        'topology R=1 K=2 cluster=True register_timeout_s=7.0',
        'set tensorpipe/worker_agreement/1',
        'get tensorpipe/worker_agreement/0',
        'get tensorpipe/trainer/chief_done',
        'exit 143'])

  def testWorkerLeavesWhenTheChiefNeverSaysDone(self):
    life = self._Life(worker_index=1, steps=self._Steps())
    life.Finish(1)
    self.assertEqual(self.events, ['get tensorpipe/trainer/chief_done',
                                   'exit 1'])

  def testOneProcessRunNeedsNoPeersNoStoreAndAnEvalNoLock(self):
    life = self._Life(num_workers=1)
    self._Start(life)
    life.Finish(0)
    self.assertEqual(self.events, [
        'lock', 'devices',
        'topology R=1 K=2 cluster=False register_timeout_s=None', 'unlock'])
    self.events.clear()
    life = self._Life(num_workers=1, take_lock=False)
    self._Start(life)
    self.assertEqual(self.events, [
        'devices', 'topology R=1 K=2 cluster=False register_timeout_s=None'])

  def testLockedLogdirStopsBeforeTheDevices(self):
    lock = _Lock(self.events, logdir_lib.LogdirLockedError('in use'))
    with self.assertRaises(logdir_lib.LogdirLockedError):
      self._Start(self._Life(lock=lock))
    self.assertEqual(self.events, ['lock'])

  def testPeerThatNeverComesIsOneLineAndUnlocks(self):
    def Missing(own, peers, timeout_s, log):
      del own, peers, log  # unused
      raise peer_wait.PeersMissingError(
          f'worker[1] at 127.0.0.1:2001 did not answer within {timeout_s:g} s')
    life = self._Life(steps=self._Steps(wait_for_peers=Missing))
    with self.assertRaisesRegex(
        run_life_cycle.StartError,
        r'^PeersMissingError: worker\[1\] at 127.0.0.1:2001 did not answer '
        r'within 7 s$'):
      self._Start(life)
    self.assertEqual(self.events, ['lock', 'devices', 'unlock'])

  def testRegistrationThatTimesOutNamesThePeers(self):
    def TimesOut(*args):
      del args  # unused
      raise tf.errors.DeadlineExceededError(None, None, 'Barrier timed out')
    life = self._Life(steps=self._Steps(make_topology=TimesOut))
    with self.assertRaisesRegex(
        run_life_cycle.StartError,
        r'worker\[1\] at 127.0.0.1:2001 accepts connections but did not '
        r'register within 7 s'):
      self._Start(life)
    self.assertEqual(self.events[-1], 'unlock')
    self.assertFalse(self.lock.held)

  def testOneProcessRegistrationErrorIsNotACluster(self):
    def TimesOut(*args):
      del args  # unused
      raise tf.errors.UnavailableError(None, None, 'no device')
    life = self._Life(num_workers=1, steps=self._Steps(
        make_topology=TimesOut))
    with self.assertRaises(tf.errors.UnavailableError):
      self._Start(life)

  def testWorkersThatDisagreeAllStopNamingTheKey(self):
    self.store.values['tensorpipe/worker_agreement/1'] = _Digests(
        _Params(max_steps=12), _FLAGS)
    life = self._Life(worker_index=0)
    with self.assertRaisesRegex(
        run_life_cycle.StartError,
        r'^ValueError: the 2 workers were started with different settings: '
        r'max_steps \(here: 10\) differ between workers \(this is worker '
        r'0\)'):
      self._Start(life)
    self.assertFalse(self.lock.held)
    self.assertEqual(self.events[-1], 'unlock')

  def testStopDuringRegistrationActsOnceTheHandlerIsBack(self):
    """TF's notifier takes SIGTERM while the cluster registers; the signal,
    held meanwhile, reaches the re-installed handler after it: an exit
    before the first step (143)."""
    def Registers(*args):
      del args  # unused
      self.events.append('topology')
      # TF's preemption notifier takes SIGTERM over.
      signal.signal(signal.SIGTERM,
                    lambda *_: self.events.append('TF took SIGTERM'))
      # Held: nothing happens yet. Sent to this thread: a signal sent to
      # the process goes to any thread that does not block it (pytest's,
      # TF's started before the hold), whose delivery runs the Python
      # handler installed now; in the trainer every thread starts held.
      signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
      self.events.append(f'exits {self.exits}')
      return 'topology'
    self.store.values['tensorpipe/worker_agreement/1'] = _Digests(
        _Params(), _FLAGS)
    life = self._Life(steps=self._Steps(make_topology=Registers))
    self._Start(life)
    self.assertIn('exits []', self.events)
    self.assertNotIn('TF took SIGTERM', self.events)
    self.assertEqual(self.exits, [143])
    self.assertIn('trainer: stopped by SIGTERM before the first step',
                  self.out.getvalue())


if __name__ == '__main__':
  unittest.main()
