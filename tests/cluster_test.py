"""Tests of tensorpipe.cluster: TF_CONFIG parsing, resolvers, timeouts.

The multi-process parts (MultiWorkerMirroredStrategy over 127.0.0.1 workers,
a worker killed mid-all-reduce) are in cluster_slow_test.py.
"""

import json
import unittest
from unittest import mock

import tensorflow as tf
# pylint: disable=g-direct-tensorflow-import
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context
# pylint: enable=g-direct-tensorflow-import

from tensorpipe import cluster
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()


def _Config(workers=('h0:2222', 'h1:2222'), task_type='worker', index=0,
            **extra):
  cfg = {'cluster': {'worker': list(workers)},
         'task': {'type': task_type, 'index': index}}
  cfg.update(extra)
  return json.dumps(cfg)


# What TF 2.21 raises when the registration does not complete (measured on
# 127.0.0.1 with worker 1's port held by a program that answers HTTP/2 and
# never registers): on the leader, its barrier's error...
_LEADER_ERROR = (
    'Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0. This '
    'usually happens because a task triggered the barrier too early or too '
    'slowly. Please look at the task logs (both timed out and first task) '
    'to debug further.\n# of tasks that reached the barrier: 1/3.\nThe first '
    'task at the barrier: /job:worker/replica:0/task:0. Some timed out task '
    'names:\n/job:worker/replica:0/task:2\n\nAdditional GRPC error '
    'information from remote target /job:worker/replica:0/task:0 while '
    'calling /tensorflow.CoordinationService/RegisterTask:\n')
# ... and on a task whose leader does not answer.
_TASK_ERROR = (
    'Deadline Exceeded\nAdditional GRPC error information from remote '
    'target /job:worker/replica:0/task:0 while calling '
    '/tensorflow.CoordinationService/RegisterTask:\n:UNKNOWN:Error received '
    'from peer  {grpc_message:"Deadline Exceeded", grpc_status:4}')


class RegistrationErrorTest(unittest.TestCase):

  def testNamesTheTasksTfReportsElseEveryPeer(self):
    hosts = 'h0:2222,h1:2222,h2:2222'
    end = (' connections but did not register within 5 s: is another program '
           'using that port (a worker of another run, a stale process)? Stop '
           'it or give the workers other ports and start every worker again, '
           'or wait longer with --peer_wait_s')
    leader = cluster.FromFlags(hosts, 0)
    self.assertEqual(cluster.RegistrationError(leader, _LEADER_ERROR, 5),
                     'worker[2] at h2:2222 accepts' + end)
    self.assertEqual(
        cluster.RegistrationError(cluster.FromFlags(hosts, 1), _TASK_ERROR,
                                  5), 'worker[0] at h0:2222 accepts' + end)
    self.assertEqual(
        cluster.RegistrationError(leader, 'Deadline Exceeded', 5),
        'worker[1] at h1:2222, worker[2] at h2:2222 accept' + end.replace(
            ' within 5 s:', ' within 5 s (TF named no task):'))

  def testWithAChiefTheChiefIsTheLeaderAndNamedAsSuch(self):
    """A cluster with a chief job: TF's leader is /job:chief/replica:0/task:0
    (a worker whose leader did not answer names chief[0]), and TF's
    worker task names map to the workers, after the chief."""
    end = (' accepts connections but did not register within 5 s: is '
           'another program using that port (a worker of another run, a '
           'stale process)? Stop it or give the workers other ports and '
           'start every worker again, or wait longer with --peer_wait_s')
    chief = cluster.Cluster(('h1:2222', 'h2:2222', 'h3:2222'), 'chief', 0,
                            chief='h0:2222')
    self.assertEqual(cluster.RegistrationError(chief, _LEADER_ERROR, 5),
                     'worker[2] at h3:2222' + end)
    self.assertEqual(
        cluster.RegistrationError(chief.WithTask('worker', 0), _TASK_ERROR,
                                  5), 'chief[0] at h0:2222' + end)


class ParseTfConfigTest(unittest.TestCase):

  def testWorkersOnlyWorkerZeroIsChief(self):
    c = cluster.ParseTfConfig(_Config(('a:1', 'b:2', 'c:3'), index=2))
    self.assertEqual(c.num_workers, 3)
    self.assertEqual(c.addresses, ('a:1', 'b:2', 'c:3'))
    self.assertEqual((c.worker_index, c.address, c.is_chief), (2, 'c:3',
                                                              False))
    self.assertTrue(c.WithTask('worker', 0).is_chief)

  def testChiefJobIsReplicaZeroAndWorkersFollow(self):
    # The numbering of multi_worker_util.id_in_cluster, which MWMS uses.
    text = json.dumps({'cluster': {'chief': ['c:9'], 'worker': ['a:1', 'b:2']},
                       'task': {'type': 'worker', 'index': 1}})
    c = cluster.ParseTfConfig(text)
    self.assertEqual(c.addresses, ('c:9', 'a:1', 'b:2'))
    self.assertEqual((c.num_workers, c.worker_index, c.is_chief), (3, 2,
                                                                  False))
    chief = c.WithTask('chief', 0)
    self.assertEqual((chief.worker_index, chief.is_chief, chief.address),
                     (0, True, 'c:9'))

  def testToTfConfigRoundTrips(self):
    for text in (_Config(index=1),
                 json.dumps({'cluster': {'chief': ['[::1]:5'],
                                         'worker': ['x:1']},
                             'task': {'type': 'chief', 'index': 0}})):
      c = cluster.ParseTfConfig(text)
      self.assertEqual(cluster.ParseTfConfig(c.ToTfConfig()), c)
      self.assertEqual(json.loads(c.ToTfConfig()), json.loads(text))

  def testStringIndexAndRpcLayerGrpcAreAccepted(self):
    c = cluster.ParseTfConfig(_Config(index='1', rpc_layer='grpc'))
    self.assertEqual(c.task_index, 1)

  def _AssertError(self, text, *fragments):
    with self.assertRaises(ValueError) as ctx:
      cluster.ParseTfConfig(text)
    msg = str(ctx.exception)
    for f in fragments:
      self.assertIn(f, msg)
    self.assertNotIn('\n', msg)

  def testBadJsonNamesTheTextAndTheFormat(self):
    self._AssertError('{"cluster": {"worker": ["h:1"]}',
                      'not valid JSON', '\'{"cluster": {"worker": ["h:1"]}\'',
                      'TF_CONFIG looks like {"cluster"')
    self._AssertError('[1, 2]', 'must be a JSON object', '[1, 2]')

  def testMissingTaskSaysWhatTaskIs(self):
    self._AssertError(json.dumps({'cluster': {'worker': ['h:1']}}),
                      'needs "task"', 'got None', 'TF_CONFIG looks like')
    self._AssertError(json.dumps({'cluster': {'worker': ['h:1']},
                                  'task': {'type': 'worker'}}),
                      'needs "task"', "{'type': 'worker'}")

  def testMissingClusterAndUnknownKeys(self):
    self._AssertError(json.dumps({'task': {'type': 'worker', 'index': 0}}),
                      'non-empty "cluster"', 'got None')
    self._AssertError(_Config(tasks=[]), "unknown keys ['tasks']")

  def testIndexOutOfRangeNamesTheRange(self):
    self._AssertError(_Config(index=2), 'task index 2', "job 'worker'",
                      'has 2 task(s)', 'index in 0..1')
    self._AssertError(_Config(index=-1), 'task index -1', 'index in 0..1')
    self._AssertError(_Config(index=True), 'task index True', 'an int')
    self._AssertError(_Config(index=1.0), 'task index 1.0', 'an int')

  def testDuplicateAddressesNameBothTasks(self):
    self._AssertError(_Config(('h:1', 'h:2', 'h:1')),
                      "address 'h:1' is used twice (worker[0] and worker[2])",
                      'its own host:port')
    text = json.dumps({'cluster': {'chief': ['h:1'], 'worker': ['h:1']},
                       'task': {'type': 'chief', 'index': 0}})
    self._AssertError(text, 'chief[0] and worker[0]')

  def testBadPortsAndHosts(self):
    self._AssertError(_Config(('h:1', 'h:99999')),
                      "worker[1]='h:99999'", "port '99999'", '1..65535')
    self._AssertError(_Config(('h:1', 'h:http')), "port 'http'")
    self._AssertError(_Config(('h:1', 'h:0')), "port '0'")
    self._AssertError(_Config(('h:1', 'h2')), "worker[1]='h2' has no port",
                      '"h2:2222"')
    self._AssertError(_Config(('h:1', ':5')), "worker[1]=':5' has no port")
    self._AssertError(_Config(('h:1', 7)), 'worker[1]=7 is not a string')
    self._AssertError(_Config(('[::1:5',)), 'unbalanced brackets')

  def testUnsupportedJobsAndTaskTypes(self):
    text = json.dumps({'cluster': {'worker': ['h:1'], 'ps': ['p:1']},
                       'task': {'type': 'worker', 'index': 0}})
    self._AssertError(text, "jobs ['ps']", 'list only "worker"')
    self._AssertError(_Config(task_type='chief'), "task type 'chief'",
                      "not a job of the cluster ['worker']")
    text = json.dumps({'cluster': {'chief': ['a:1', 'b:1']},
                       'task': {'type': 'chief', 'index': 0}})
    self._AssertError(text, '2 chief addresses', 'at most one chief')
    self._AssertError(json.dumps({'cluster': {'worker': 'h:1'},
                                  'task': {'type': 'worker', 'index': 0}}),
                      'cluster["worker"]=\'h:1\' must be a list')
    self._AssertError(_Config(rpc_layer='grpc+verbs'),
                      "rpc_layer='grpc+verbs'")


class FromFlagsOrEnvironmentTest(unittest.TestCase):

  def testNoClusterIsNone(self):
    self.assertIsNone(cluster.ClusterFromFlagsOrEnvironment(environ={}))
    self.assertIsNone(cluster.ClusterFromFlagsOrEnvironment(
        environ={'TF_CONFIG': '  '}))

  def testFromEnvironment(self):
    c = cluster.ClusterFromFlagsOrEnvironment(
        environ={'TF_CONFIG': _Config(index=1)})
    self.assertEqual((c.workers, c.task_index), (('h0:2222', 'h1:2222'), 1))

  def testFromFlags(self):
    c = cluster.ClusterFromFlagsOrEnvironment('a:1, b:2', 1, environ={})
    self.assertEqual(c, cluster.Cluster(workers=('a:1', 'b:2'),
                                        task_type='worker', task_index=1))
    self.assertEqual(cluster.FromFlags(['a:1'], 0).num_workers, 1)

  def testConflictingOrIncompleteSources(self):
    with self.assertRaisesRegex(ValueError, 'both --worker_hosts and the '
                                'TF_CONFIG'):
      cluster.ClusterFromFlagsOrEnvironment(
          'a:1', 0, environ={'TF_CONFIG': _Config()})
    with self.assertRaisesRegex(ValueError, "--worker_hosts='a:1' needs "
                                '--task_index'):
      cluster.ClusterFromFlagsOrEnvironment('a:1', None, environ={})
    with self.assertRaisesRegex(ValueError, '--task_index=1 without '
                                '--worker_hosts'):
      cluster.ClusterFromFlagsOrEnvironment(None, 1, environ={})
    with self.assertRaisesRegex(ValueError, "worker_hosts=' , ' is empty"):
      cluster.FromFlags(' , ', 0)
    with self.assertRaisesRegex(ValueError, 'task index 2 of job'):
      cluster.FromFlags('a:1,b:1', 2)


class FaultTimeoutsTest(unittest.TestCase):

  def testDefaultsAndValidation(self):
    t = cluster.FaultTimeouts()
    self.assertIsNone(t.collective_timeout_s)
    self.assertGreater(t.heartbeat_timeout_s, 0)
    for bad in (0, -1, True, '5'):
      with self.assertRaisesRegex(ValueError, 'heartbeat_timeout_s=.* must be '
                                  'a number of seconds > 0'):
        cluster.FaultTimeouts(heartbeat_timeout_s=bad)
    self.assertEqual(cluster.CommunicationOptions(
        cluster.FaultTimeouts(collective_timeout_s=7.5)).timeout_seconds, 7.5)


class CoordinationServiceTest(unittest.TestCase):
  """The service is configured as MWMS would, with our timeouts (a fake
  context records the call: configuring the real one would change this
  test process)."""

  def _Configure(self, c, timeouts):
    fake = mock.Mock()
    fake.coordination_service = (
        coordination_config_pb2.CoordinationServiceConfig())
    with mock.patch.object(context, 'context', return_value=fake):
      cluster.ConfigureCoordinationService(c, timeouts)
    fake.configure_coordination_service.assert_called_once()
    return (fake.configure_coordination_service.call_args.kwargs,
            fake.coordination_service)

  def testLeaderJobsAndTimeouts(self):
    timeouts = cluster.FaultTimeouts(heartbeat_timeout_s=5,
                                     cluster_register_timeout_s=7.5,
                                     shutdown_barrier_timeout_s=9)
    with_chief = cluster.ParseTfConfig(json.dumps({
        'cluster': {'chief': ['c:1'], 'worker': ['a:1', 'b:1']},
        'task': {'type': 'worker', 'index': 0}}))
    for c in (cluster.ParseTfConfig(_Config(('a:1', 'b:1', 'c:1'))),
              with_chief):
      kwargs, config = self._Configure(c, timeouts)
      # The leader MWMS itself would pick.
      self.assertEqual(kwargs['service_leader'],
                       multi_worker_util.coordination_leader(
                           tf.train.ClusterSpec(c.ClusterSpecDict())))
      self.assertEqual(kwargs['service_type'], 'standalone')
      self.assertEqual(
          sorted((j.name, j.num_tasks) for j in kwargs['coordinated_jobs']),
          sorted((job, len(a)) for job, a in c.ClusterSpecDict().items()))
      self.assertEqual((kwargs['heartbeat_timeout_in_ms'],
                        kwargs['cluster_register_timeout_in_ms'],
                        kwargs['shutdown_barrier_timeout_in_ms']),
                       (5000, 7500, 9000))
      self.assertTrue(config.cluster_register_with_barrier)


class ClusterResolverTest(unittest.TestCase):

  def setUp(self):
    self.cluster = cluster.ParseTfConfig(_Config(index=1))

  def testOneGpuPerWorkerOrNone(self):
    # MWMS makes one replica per accelerator the resolver reports; a
    # TensorPipe replica (one whole pipeline) must report at most one.
    gpu = cluster.ClusterResolver(self.cluster, num_gpus_per_worker=1)
    self.assertEqual(gpu.num_accelerators(), {'GPU': 1})
    cpu = cluster.ClusterResolver(self.cluster, num_gpus_per_worker=0)
    self.assertEqual(cpu.num_accelerators(), {})
    self.assertEqual(cpu.cluster_spec().as_dict(),
                     {'worker': ['h0:2222', 'h1:2222']})
    self.assertEqual((cpu.task_type, cpu.task_id, cpu.rpc_layer),
                     ('worker', 1, 'grpc'))
    default = cluster.ClusterResolver(self.cluster)
    self.assertEqual(default.num_accelerators(),
                     {'GPU': 1} if tf.config.list_physical_devices('GPU')
                     else {})
    with self.assertRaisesRegex(ValueError, 'num_gpus_per_worker=4'):
      cluster.ClusterResolver(self.cluster, num_gpus_per_worker=4)


if __name__ == '__main__':
  unittest.main()
