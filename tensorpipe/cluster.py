"""The cluster of a multi-worker run: TF_CONFIG parsing and strategies.

TensorPipe scales out as R data-parallel replicas of a K-stage pipeline
(GPipe, Huang et al. 2018, section 3: the TPU pods run replicas of a pipeline;
Lingvo calls the stage devices of one replica its "split"). Across hosts this
runs on TensorFlow's own runtime: one worker process per replica, each
pipelining over its K local devices, gradients all-reduced by
`tf.distribute.MultiWorkerMirroredStrategy` (MWMS) over gRPC. On one host the
same R x K layout can also run in one process (device_groups.py:
`SplitDeviceGroups` cuts the local devices into R groups of K and
`MirroredStrategyOverGroups` mirrors over the groups' first devices).

This module is the part that knows about clusters:

  cluster = ClusterFromFlagsOrEnvironment(worker_hosts, task_index)  # or None
  strategy = MultiWorkerStrategy(cluster)     # before any TF op runs
  cluster.is_chief, cluster.worker_index, cluster.num_workers

`Cluster` is pure Python (the launcher uses it to write TF_CONFIG); the
strategy builders import TensorFlow when called. Every malformed cluster
description is a ValueError naming the value and the fix, raised before TF
sees it.

Failure detection (`FaultTimeouts`): when a worker dies, the others are
blocked in a collective all-reduce. MWMS starts TF's coordination service
(leader: the chief, else worker 0); every task sends it heartbeats, and when
one misses them for `heartbeat_timeout_s` the service reports the error to all
tasks, whose pending collectives then fail with UnavailableError ("The
following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1"). This bounds the hang by the heartbeat
timeout, independently of how long a legitimate step takes (a collective
timeout would also fire while the chief writes a long checkpoint and the
others wait at the next all-reduce). Measured on 127.0.0.1 (2 workers, a
worker killed while its peer waits in an all-reduce; TF 2.21, 2 loaded
cores), with heartbeat_timeout_s=5:

  worker 1 SIGKILLed   peer's error after 3.4-3.6 s, process exit 5.4-8 s
  worker 1 SIGSTOPped  (hung: sockets stay open) error 3.4 s, exit 5.7 s
  leader SIGKILLed     error 0.15 s (connection reset), exit 3.5 s
  leader SIGSTOPped    error 3.7 s (heartbeat RPC deadline), exit 7.5 s
  TF's defaults        (10 s heartbeat) worker 1 SIGKILLed: error 9.1 s,
                       exit 11.7 s

At start-up the leader would wait forever for a worker that never comes up;
`cluster_register_timeout_s` with the registration barrier set here makes
every task fail after it (measured: 6 s with 5 s on the leader, 11 s on a
task whose leader does not answer); tools/trainer sets it to --peer_wait_s,
waits for the peers in Python first (peer_wait.py) and names the tasks TF
reports (`RegistrationError`).

Signals during the registration: it is one C++ call
(TFE_EnableCollectiveOps) that holds the GIL, so no Python code runs until
it returns, not even a watchdog thread (measured: a thread printing every
0.5 s printed nothing for the 6 s); and before it starts the registration
it installs TF's preemption notifier as SIGTERM's handler, which records
the signal for TF and does not stop anything. The trainer therefore blocks
SIGTERM and SIGINT in its main thread before TensorFlow starts any thread
(TF's threads inherit the mask, so none of them ever takes the signals),
re-installs its own handler after the call and unblocks: a signal that
came during the registration stops the process the moment the call
returns, with exit code 143 / 130 (preemption.StopSignals.Hold). The wait
is bounded by the registration timeout; the peer wait before it, where a
signal acts at once, already refuses a port that answers as no worker.
"""

import dataclasses
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

# The cluster jobs MultiWorkerMirroredStrategy trains with. ('ps' belongs to
# ParameterServerStrategy; 'evaluator' runs apart from the training cluster.)
_JOBS = ('chief', 'worker')

_TF_CONFIG_EXAMPLE = ('{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
                      '"task": {"type": "worker", "index": 0}}')


def _Fix(what: str) -> str:
  return f'{what}; TF_CONFIG looks like {_TF_CONFIG_EXAMPLE}'


def CheckAddress(address: Any, where: str) -> str:
  """Checks one 'host:port' entry; returns it unchanged."""
  if not isinstance(address, str):
    raise ValueError(f'{where}={address!r} is not a string; give addresses as '
                     '"host:port" strings, e.g. "10.0.0.1:2222"')
  host, sep, port = address.rpartition(':')
  if not sep or not host:
    raise ValueError(f'{where}={address!r} has no port; give "host:port", '
                     f'e.g. "{address or "10.0.0.1"}:2222"')
  if host.startswith('[') != host.endswith(']'):
    raise ValueError(f'{where}={address!r}: unbalanced brackets around the '
                     'IPv6 host; write it as "[::1]:2222"')
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(f'{where}={address!r}: port {port!r} is not an integer '
                     'in 1..65535; use e.g. "host:2222"')
  return address


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A validated multi-worker cluster and this process's place in it.

  Replicas are numbered like MultiWorkerMirroredStrategy numbers them: the
  chief (if the cluster has a 'chief' job) is replica 0 and worker i is
  replica i + 1; without a chief, worker i is replica i and worker 0 is the
  chief (writes checkpoints and summaries).

  Attributes:
    workers: 'host:port' of every 'worker' task, in task order.
    task_type: this process's job, 'worker' or 'chief'.
    task_index: this process's index within its job.
    chief: 'host:port' of the 'chief' task, or None if there is no chief job.
    rpc_layer: the RPC protocol of TF's servers ('grpc').
  """
  workers: Tuple[str, ...]
  task_type: str
  task_index: int
  chief: Optional[str] = None
  rpc_layer: str = 'grpc'

  def __post_init__(self):
    # Validates direct construction too (FromFlags and ParseTfConfig build
    # through here), so a Cluster in hand is always consistent.
    if isinstance(self.workers, (str, bytes)) or not isinstance(
        self.workers, (list, tuple)):
      raise ValueError(f'workers={self.workers!r} must be a list of '
                       '"host:port" strings')
    object.__setattr__(self, 'workers', tuple(self.workers))
    if self.chief is not None:
      CheckAddress(self.chief, 'chief')
    for i, a in enumerate(self.workers):
      CheckAddress(a, f'worker[{i}]')
    if not self.workers and self.chief is None:
      raise ValueError('the cluster has no tasks; list at least one worker '
                       'address ("host:port")')
    seen: Dict[str, str] = {}
    for name, a in self._Named():
      if a in seen:
        raise ValueError(f'address {a!r} is used twice ({seen[a]} and '
                         f'{name}); give every task its own host:port')
      seen[a] = name
    if self.task_type not in _JOBS:
      raise ValueError(f'task type {self.task_type!r} is not supported; '
                       f'MultiWorkerMirroredStrategy trains with the jobs '
                       f'{list(_JOBS)}')
    size = len(self.workers) if self.task_type == 'worker' else (
        0 if self.chief is None else 1)
    if (isinstance(self.task_index, bool) or
        not isinstance(self.task_index, int)):
      raise ValueError(f'task index {self.task_index!r} must be an int in '
                       f'0..{size - 1}')
    if not 0 <= self.task_index < size:
      raise ValueError(f'task index {self.task_index} of job '
                       f'{self.task_type!r} is out of range: the job has '
                       f'{size} task(s); use an index in 0..{size - 1}'
                       if size else
                       f'task type {self.task_type!r} has no tasks in the '
                       'cluster; add its address or change the task type')
    if self.rpc_layer != 'grpc':
      raise ValueError(f'rpc_layer={self.rpc_layer!r} is not supported; use '
                       '"grpc" (or leave it out)')

  def _JobTasks(self) -> List[Tuple[str, int, str]]:
    """(job, index, 'host:port') of every task in replica order."""
    chief = [] if self.chief is None else [('chief', 0, self.chief)]
    return chief + [('worker', i, a) for i, a in enumerate(self.workers)]

  def _Named(self) -> List[Tuple[str, str]]:
    return [(f'{job}[{i}]', a) for job, i, a in self._JobTasks()]

  @property
  def tasks(self) -> List[Tuple[str, str]]:
    """(name, 'host:port') of every task in replica order, e.g.
    ('worker[1]', '10.0.0.2:2222')."""
    return self._Named()

  @property
  def addresses(self) -> Tuple[str, ...]:
    """Every task's 'host:port', in replica order (chief first)."""
    return tuple(a for _, a in self._Named())

  @property
  def num_workers(self) -> int:
    """R: the number of worker processes (= replicas), chief included."""
    return len(self.addresses)

  @property
  def worker_index(self) -> int:
    """This process's replica index in 0..R-1 (the chief is 0)."""
    if self.task_type == 'chief':
      return 0
    return self.task_index + (0 if self.chief is None else 1)

  @property
  def is_chief(self) -> bool:
    """Whether this process writes checkpoints and summaries."""
    return self.worker_index == 0

  @property
  def address(self) -> str:
    """This process's own 'host:port'."""
    return self.addresses[self.worker_index]

  def ClusterSpecDict(self) -> Dict[str, List[str]]:
    """{job: [addresses]} as tf.train.ClusterSpec takes it."""
    spec = {'worker': list(self.workers)} if self.workers else {}
    if self.chief is not None:
      spec['chief'] = [self.chief]
    return spec

  def ToTfConfig(self) -> str:
    """This cluster as the TF_CONFIG JSON text (round-trips ParseTfConfig)."""
    return json.dumps({'cluster': self.ClusterSpecDict(),
                       'task': {'type': self.task_type,
                                'index': self.task_index}})

  def WithTask(self, task_type: str, task_index: int) -> 'Cluster':
    """The same cluster seen from another task."""
    return dataclasses.replace(self, task_type=task_type,
                               task_index=task_index)


def ParseTfConfig(text: str) -> Cluster:
  """Parses and validates a TF_CONFIG JSON text.

  Args:
    text: e.g. '{"cluster": {"worker": ["h0:2222", "h1:2222"]},
      "task": {"type": "worker", "index": 1}}'; an optional "chief" job with
      one address, and "rpc_layer": "grpc", are accepted.

  Returns:
    The Cluster.

  Raises:
    ValueError: bad JSON, missing or malformed "cluster" or "task", an
      unsupported job ('ps', 'evaluator'), a bad or duplicate address, an
      index out of range; the message names the value and the fix.
  """
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(_Fix(f'TF_CONFIG is not valid JSON ({e.msg} at '
                          f'character {e.pos}): {text!r}')) from None
  if not isinstance(config, dict):
    raise ValueError(_Fix(f'TF_CONFIG must be a JSON object, got {text!r}'))
  unknown = sorted(set(config) - {'cluster', 'task', 'rpc_layer',
                                  'environment'})
  if unknown:
    raise ValueError(_Fix(f'TF_CONFIG has unknown keys {unknown}; expected '
                          '"cluster" and "task"'))
  cluster = config.get('cluster')
  if not isinstance(cluster, dict) or not cluster:
    raise ValueError(_Fix(f'TF_CONFIG needs a non-empty "cluster" object, '
                          f'got {cluster!r}'))
  other_jobs = sorted(set(cluster) - set(_JOBS))
  if other_jobs:
    raise ValueError(f'TF_CONFIG cluster has jobs {other_jobs}, which '
                     'MultiWorkerMirroredStrategy does not run; list only '
                     '"worker" (and optionally one "chief") addresses')
  for job in cluster:
    if not isinstance(cluster[job], list):
      raise ValueError(_Fix(f'TF_CONFIG cluster["{job}"]={cluster[job]!r} '
                            'must be a list of "host:port" strings'))
  chiefs = cluster.get('chief', [])
  if len(chiefs) > 1:
    raise ValueError(f'TF_CONFIG lists {len(chiefs)} chief addresses '
                     f'{chiefs}; a cluster has at most one chief (move the '
                     'others to "worker")')
  task = config.get('task')
  if not isinstance(task, dict) or 'type' not in task or 'index' not in task:
    raise ValueError(_Fix(f'TF_CONFIG needs "task": {{"type": ..., "index": '
                          f'...}} saying which task this process is, got '
                          f'{task!r}'))
  task_type, index = task['type'], task['index']
  if task_type not in cluster:
    raise ValueError(f'TF_CONFIG task type {task_type!r} is not a job of the '
                     f'cluster {sorted(cluster)}; use one of them')
  if isinstance(index, str) and index.isdigit():
    index = int(index)  # TF's own resolver accepts "1" as well
  return Cluster(workers=tuple(cluster.get('worker', [])),
                 task_type=task_type, task_index=index,
                 chief=chiefs[0] if chiefs else None,
                 rpc_layer=config.get('rpc_layer') or 'grpc')


def FromFlags(worker_hosts: Any, task_index: int,
              task_type: str = 'worker') -> Cluster:
  """A cluster of workers from flag values.

  Args:
    worker_hosts: 'host:port,host:port,...' or a list of 'host:port'.
    task_index: this process's index in `worker_hosts`.
    task_type: 'worker' (the first worker is then the chief).

  Raises:
    ValueError: as ParseTfConfig.
  """
  hosts = worker_hosts
  if isinstance(hosts, str):
    hosts = [h.strip() for h in hosts.split(',') if h.strip()]
  if not hosts:
    raise ValueError(f'worker_hosts={worker_hosts!r} is empty; give '
                     '"host0:port,host1:port,..."')
  return Cluster(workers=tuple(hosts), task_type=task_type,
                 task_index=task_index)


def ClusterFromFlagsOrEnvironment(
    worker_hosts: Any = None, task_index: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None) -> Optional[Cluster]:
  """The cluster from flags or TF_CONFIG, or None for a single process.

  Args:
    worker_hosts: flag value, 'host:port,...' or a list; None/'' if unset.
    task_index: flag value; required with worker_hosts.
    environ: the environment (default os.environ); TF_CONFIG is read there.

  Raises:
    ValueError: both flags and TF_CONFIG given, worker_hosts without
      task_index, or a malformed description.
  """
  environ = os.environ if environ is None else environ
  text = environ.get('TF_CONFIG', '').strip()
  if worker_hosts:
    if text:
      raise ValueError('both --worker_hosts and the TF_CONFIG environment '
                       'variable describe the cluster; unset TF_CONFIG or '
                       'drop --worker_hosts/--task_index')
    if task_index is None:
      raise ValueError(f'--worker_hosts={worker_hosts!r} needs --task_index '
                       '(this process\'s position in the list)')
    return FromFlags(worker_hosts, task_index)
  if task_index is not None:
    raise ValueError(f'--task_index={task_index} without --worker_hosts; '
                     'give both, or describe the cluster in TF_CONFIG')
  if not text:
    return None
  return ParseTfConfig(text)


# -- strategies (TensorFlow from here on) --------------------------------------


@dataclasses.dataclass(frozen=True)
class FaultTimeouts:
  """How long a worker waits for a dead or hung peer before failing.

  Attributes:
    heartbeat_timeout_s: the coordination service declares a task dead after
      this long without its heartbeat, and every other task's pending and
      later collectives fail (this is what bounds the hang when a worker is
      SIGKILLed or its host disappears). 10 s is TF's own default; raise it
      if hosts can stall longer (swapping, long GC pauses).
    collective_timeout_s: if set, every collective all-reduce that takes
      longer fails with DeadlineExceededError. Off by default: it must exceed
      the longest legitimate wait at an all-reduce (a slow first step, the
      chief writing a checkpoint) and costs a thread per collective.
    cluster_register_timeout_s: how long the tasks wait for each other at
      start-up before failing (a worker that never comes up).
    shutdown_barrier_timeout_s: how long a finished task waits at exit for
      the others to finish (e.g. the chief's last checkpoint or eval) before
      it reports an error; a dead peer does not make it wait this long.
  """
  heartbeat_timeout_s: float = 10.0
  collective_timeout_s: Optional[float] = None
  cluster_register_timeout_s: float = 600.0
  shutdown_barrier_timeout_s: float = 300.0

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if v is None and f.name == 'collective_timeout_s':
        continue
      if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f'{f.name}={v!r} must be a number of seconds > 0')


def _HasGpus() -> bool:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return bool(tf.config.list_physical_devices('GPU'))


def ClusterResolver(cluster: Cluster,
                    num_gpus_per_worker: Optional[int] = None) -> Any:
  """A SimpleClusterResolver for `cluster` with one accelerator per worker.

  MWMS makes one replica per accelerator its resolver reports (and, with
  TF's TFConfigClusterResolver, one per visible GPU). A TensorPipe replica is
  a whole K-stage pipeline whose first stage device is the replica's device,
  so each worker must report one GPU (or none: the replica then lives on
  /device:CPU:0).

  Args:
    cluster: the cluster.
    num_gpus_per_worker: GPUs each replica is mirrored over; default 1 if this
      host has a GPU, else 0.

  Returns:
    A tf.distribute.cluster_resolver.SimpleClusterResolver.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if num_gpus_per_worker is None:
    num_gpus_per_worker = 1 if _HasGpus() else 0
  if num_gpus_per_worker not in (0, 1):
    raise ValueError(f'num_gpus_per_worker={num_gpus_per_worker!r}: a '
                     'TensorPipe replica is one pipeline, mirrored over its '
                     'first stage device; use 0 or 1')
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster.ClusterSpecDict()),
      task_type=cluster.task_type, task_id=cluster.task_index,
      num_accelerators={'GPU': 1} if num_gpus_per_worker else {},
      rpc_layer=cluster.rpc_layer)


def _TaskName(job: str, index: int) -> str:
  return f'/job:{job}/replica:0/task:{index}'


def _LeaderTaskName(cluster: Cluster) -> str:
  """TF's name of the task hosting the coordination service: the chief,
  else worker 0."""
  return (_TaskName('chief', 0) if cluster.chief is not None else
          _TaskName('worker', 0))


def RegistrationError(cluster: Cluster, message: str, timeout_s: float,
                      flag: str = '--peer_wait_s') -> str:
  """One line for a start-up whose registration with TF did not complete.

  Every peer answered the peer wait (peer_wait.py), but TF's coordination
  service did not see them all register within `timeout_s`: a TF server
  of another run, or a worker that died between the two waits. Names the
  peers TF reports (the leader's barrier lists the tasks that timed out; a
  task whose leader did not answer names the leader), else every peer,
  with their addresses, and what to check.

  Args:
    cluster: the cluster, seen from this task.
    message: the error's text (tf.errors.OpError.message).
    timeout_s: the registration timeout.
    flag: the setting that changes `timeout_s`.
  """
  # TF's task name -> the task as `tasks` names it, in replica order:
  # /job:worker/replica:0/task:1 -> ('worker[1]', 'h1:2222').
  by_tf_name = {_TaskName(job, i): (f'{job}[{i}]', a)
                for job, i, a in cluster._JobTasks()}  # pylint: disable=protected-access
  own = _TaskName(cluster.task_type, cluster.task_index)
  leader = _LeaderTaskName(cluster)
  found = []
  _, marker, tail = message.partition('timed out task names:')
  if marker:
    found = re.findall(r'/job:\w+/replica:\d+/task:\d+',
                       tail.split('\n\n')[0])
  elif 'RegisterTask' in message and own != leader:
    found = [leader]
  found = [t for t in dict.fromkeys(found) if t in by_tf_name and t != own]
  reported = bool(found)
  if not found:
    found = [t for t in by_tf_name if t != own]
  names = ', '.join(f'{by_tf_name[t][0]} at {by_tf_name[t][1]}'
                    for t in found)
  verb = 'accepts' if len(found) == 1 else 'accept'
  return (f'{names} {verb} connections but did not register within '
          f'{timeout_s:g} s{"" if reported else " (TF named no task)"}: is '
          'another program using that port (a worker of another run, a '
          'stale process)? Stop it or give the workers other ports and '
          f'start every worker again, or wait longer with {flag}')


def ConfigureCoordinationService(cluster: Cluster,
                                 timeouts: FaultTimeouts) -> None:
  """Sets up TF's coordination service with `timeouts`, as MWMS would.

  MWMS configures the service itself (with TF's default timeouts) only when
  none is configured yet, so configuring it first, with the same leader and
  jobs, changes only the timeouts. TF 2.21 has no public API for this; the
  eager context's `configure_coordination_service` is what MWMS calls.
  Must run before TensorFlow initialises its devices.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
  from tensorflow.python.eager import context
  # pylint: enable=g-import-not-at-top
  jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=n)
          for job, n in (('chief', 0 if cluster.chief is None else 1),
                         ('worker', len(cluster.workers))) if n]
  context.context().configure_coordination_service(
      service_type='standalone', service_leader=_LeaderTaskName(cluster),
      enable_health_check=True,
      cluster_register_timeout_in_ms=int(
          timeouts.cluster_register_timeout_s * 1000),
      heartbeat_timeout_in_ms=int(timeouts.heartbeat_timeout_s * 1000),
      shutdown_barrier_timeout_in_ms=int(
          timeouts.shutdown_barrier_timeout_s * 1000),
      coordinated_jobs=jobs)
  # Without the barrier only the non-leader tasks time out at start-up; the
  # leader would wait for a missing worker forever.
  context.context().coordination_service.cluster_register_with_barrier = True


def CommunicationOptions(timeouts: FaultTimeouts) -> Any:
  """tf.distribute.experimental.CommunicationOptions for `timeouts`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.experimental.CommunicationOptions(
      timeout_seconds=timeouts.collective_timeout_s)


def MultiWorkerStrategy(
    cluster: Cluster, timeouts: FaultTimeouts = FaultTimeouts(),
    num_gpus_per_worker: Optional[int] = None) -> Any:
  """MultiWorkerMirroredStrategy over `cluster`: one replica per worker.

  Call at program start, after the logical devices are configured and
  before any TensorFlow op runs (MWMS starts this process's gRPC server and
  the collective runtime). Blocks until every worker has started.

  Args:
    cluster: the cluster (ClusterFromFlagsOrEnvironment).
    timeouts: failure detection (see FaultTimeouts).
    num_gpus_per_worker: see ClusterResolver.

  Returns:
    A tf.distribute.MultiWorkerMirroredStrategy with
    num_replicas_in_sync == cluster.num_workers.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ConfigureCoordinationService(cluster, timeouts)
  return tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=ClusterResolver(cluster, num_gpus_per_worker),
      communication_options=CommunicationOptions(timeouts))
