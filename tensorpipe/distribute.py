"""Data parallelism x pipeline: R replicas of a K-partition model.

GPipe at scale runs R copies ("replicas") of a K-partition pipeline, each on
its own group of K devices, and sums the weight gradients of the R replicas
before one synchronous update (the paper's TPU pods; Lingvo's "splits" of a
replica). TensorFlow's strategies give one device per replica and put a
replica's variables on that one device (tensorflow#24326), so this module
keeps the weights out of the strategy's hands:

  * every replica has its own copy of the task, built with its pipeline's
    `devices` set to the replica's device group, so partition k's weights and
    optimizer slots live on stage device k of their own replica. Weights are
    initialised from the layer paths (`base_layer`), so the copies start equal
    in every replica and every process;
  * the strategy (`MirroredStrategy` over the groups' first devices in one
    process, `MultiWorkerMirroredStrategy` with one replica per worker
    process) only runs the replica function in its threads / processes and
    all-reduces: the gradients, the batch-norm statistics
    (`py_utils.AddBatchStats`) and the loss weights;
  * each replica applies the same all-reduced gradients to its own copy with
    an optimizer of `tensorpipe.optimizers` (plain slot variables, keyed by
    variable path), so the copies stay bitwise equal (`CheckReplicasEqual`).

One step, in pseudo-code (replica r of R, per-replica batch n = N / R):

  rows = batch[r n : (r + 1) n]                 # the single-process batch
  with ReplicaExampleOffset(n):                 # masks of rows r n ...
    loss_r, w_r = task_r(rows)                  # w_r: examples or tokens
  W = all_reduce(w_r)
  objective_r = loss_r * w_r / W
  g = all_reduce(grad(objective_r, theta_r))    # = grad of the global loss
  g += grad(regulariser, theta_r)               # once, after the all-reduce
  optimizer_r.Apply(lr, clip(g), theta_r)

With R = 1 no collective runs and g = grad(loss) + grad(regulariser), bit
for bit the single-replica step. With R = 2, power-of-two batch shares and
the pipelines' grad_sum='pairwise' (grad_sum.py), g equals the single
process's bit for bit.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tensorpipe import checks
from tensorpipe import device_groups
from tensorpipe import hyperparams
from tensorpipe import py_utils
from tensorpipe import schedule_builders

# Key of TrainStep's result with `stop`: the stop flags summed over replicas.
STOP_VOTES = 'stop_votes'

@dataclasses.dataclass(frozen=True)
class Topology:
  """Where the R replicas x K partitions of a run live.

  Attributes:
    strategy: the tf.distribute strategy that runs the replica function.
    num_replicas: R, replicas in sync over all processes.
    groups: the device groups of THIS process's replicas, K devices each,
      in replica order; [None] for one replica built as configured.
    first_replica: global index of this process's first replica.
    is_chief: whether this process writes checkpoints and summaries.
  """
  strategy: tf.distribute.Strategy
  num_replicas: int
  groups: Sequence[Sequence[str]]
  first_replica: int = 0
  is_chief: bool = True

  @property
  def num_local_replicas(self) -> int:
    return len(self.groups)


def LocalTopology(groups: Sequence[Sequence[str]]) -> Topology:
  """One process, one replica per device group (R = len(groups))."""
  strategy = device_groups.MirroredStrategyOverGroups(groups)
  return Topology(strategy=strategy, num_replicas=len(groups),
                  groups=[list(g) for g in groups])


def MultiWorkerTopology(strategy: tf.distribute.Strategy, group: Sequence[str],
                        replica_index: int, is_chief: bool) -> Topology:
  """One replica in this worker process, on its local device group."""
  return Topology(strategy=strategy,
                  num_replicas=strategy.num_replicas_in_sync,
                  groups=[list(group)], first_replica=replica_index,
                  is_chief=is_chief)


def SingleReplicaTopology() -> Topology:
  """R = 1 in this process: MirroredStrategy over one device, no collective.

  The task is built as configured (its pipeline's own `devices`); the
  strategy only gives the trainer one code path for any R.
  """
  gpus = tf.config.list_logical_devices('GPU')
  first = gpus[0].name if gpus else tf.config.list_logical_devices('CPU')[0].name
  return Topology(strategy=tf.distribute.MirroredStrategy([first]),
                  num_replicas=1, groups=[None])


def MakeTopology(num_replicas: int, num_partitions: int,
                 cluster: Any = None, timeouts: Any = None) -> Topology:
  """The topology of a run: from a cluster, R local groups, or R = 1.

  Call at program start, after the logical devices are configured and before
  any other TensorFlow op (a cluster starts this process's server).

  Args:
    num_replicas: R for a single process (device groups of K devices);
      must be 1 with a cluster, where R is the number of workers.
    num_partitions: K, each replica's pipeline partitions.
    cluster: a `cluster.Cluster` (from TF_CONFIG or flags), or None.
    timeouts: the cluster's `cluster.FaultTimeouts` (default TF's own).

  Raises:
    ValueError: R < 1, R > 1 with a cluster, or too few devices.
  """
  from tensorpipe import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  checks.CheckPositiveInts('', num_replicas=num_replicas)
  if cluster is not None:
    if num_replicas != 1:
      raise ValueError(
          f'--num_replicas={num_replicas} with a cluster: each worker process '
          f'is one replica, so R is the number of workers '
          f'({cluster.num_workers}); drop --num_replicas')
    # The strategy first: listing devices would initialise the runtime,
    # after which collectives can no longer be configured.
    strategy = cluster_lib.MultiWorkerStrategy(
        cluster, timeouts or cluster_lib.FaultTimeouts())
    group = device_groups.LocalDeviceGroups(1, num_partitions)[0]
    return MultiWorkerTopology(strategy, group, cluster.worker_index,
                               cluster.is_chief)
  if num_replicas == 1:
    return SingleReplicaTopology()
  return LocalTopology(device_groups.LocalDeviceGroups(num_replicas,
                                                       num_partitions))


def PipelineParamsIn(p: hyperparams.Params) -> List[hyperparams.Params]:
  """The TensorPipeLayer Params inside a Params tree (depth first)."""
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  found = []

  def Visit(value):
    if isinstance(value, hyperparams.InstantiableParams) and (
        isinstance(value.cls, type) and
        issubclass(value.cls, pipeline.TensorPipeLayer)):
      found.append(value)
      return
    if isinstance(value, hyperparams.Params):
      for _, v in value.IterParams():
        Visit(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        Visit(v)
  Visit(p)
  return found


def NumPartitions(pipe: hyperparams.Params) -> int:
  """K of a TensorPipeLayer's Params: the devices its pipeline runs on.

  With manual `partitions`, their number over the stages per device
  (num_stages_per_device, or the schedule's own); else `num_partitions`.
  """
  if pipe.partitions is not None:
    return len(pipe.partitions) // schedule_builders.NumStagesPerDevice(pipe)
  return pipe.num_partitions


def MaxNumPartitions(p: hyperparams.Params) -> int:
  """The largest K of the TensorPipeLayers in a Params tree; 1 if none."""
  return max([1] + [NumPartitions(pipe) for pipe in PipelineParamsIn(p)])


def ReplicaParams(task_params: hyperparams.Params,
                  group: Sequence[str]) -> hyperparams.Params:
  """A copy of `task_params` whose pipeline runs on device group `group`.

  Raises:
    ValueError: if the task holds no TensorPipeLayer, or a pipeline names
      its own devices or needs more devices than the group has.
  """
  p = task_params.Copy()
  pipes = PipelineParamsIn(p)
  if not pipes:
    raise ValueError(f'task {p.name!r} holds no TensorPipeLayer; replicas '
                     'place a pipeline on each device group')
  for pipe in pipes:
    if pipe.devices is not None:
      raise ValueError(
          f'TensorPipeLayer {pipe.name!r} sets devices={pipe.devices!r}; with '
          'data-parallel replicas each replica uses its own device group: '
          'leave devices=None')
    k = NumPartitions(pipe)
    if k > len(group):
      raise ValueError(f'TensorPipeLayer {pipe.name!r} has {k} partitions but '
                       f'the device group {list(group)} has {len(group)} '
                       'devices')
    pipe.devices = list(group[:k])
  return p


def BuildReplicas(task_params: hyperparams.Params,
                  topology: Topology) -> List[Any]:
  """Instantiates one task per local device group (variables on its group)."""
  tasks = []
  for group in topology.groups:
    if group is None:  # SingleReplicaTopology: the task as configured.
      tasks.append(task_params.Instantiate())
      continue
    with tf.device(group[0]):
      tasks.append(ReplicaParams(task_params, group).Instantiate())
  return tasks


def LocalReplicaIndex(topology: Topology) -> int:
  """Index (into topology.groups) of the replica running this thread.

  Call inside the function given to `strategy.run`.
  """
  ctx = tf.distribute.get_replica_context()
  if ctx is None:
    raise ValueError('LocalReplicaIndex needs a replica context: call it '
                     'inside strategy.run')
  replica = tf.get_static_value(ctx.replica_id_in_sync_group)
  if replica is None:
    raise ValueError('the replica id is not static in this strategy; '
                     'TensorPipe replicas need MirroredStrategy or '
                     'MultiWorkerMirroredStrategy')
  local = int(replica) - topology.first_replica
  if not 0 <= local < topology.num_local_replicas:
    raise ValueError(f'replica {int(replica)} is not one of this process\'s '
                     f'replicas {topology.first_replica}..'
                     f'{topology.first_replica + topology.num_local_replicas - 1}')
  return local


def NumReplicasInSync() -> int:
  """R of the current replica context (1 outside any strategy)."""
  ctx = tf.distribute.get_replica_context()
  return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def AllReduceSum(values: Any) -> Any:
  """Sums a structure of tensors over the replicas in sync (identity if R=1).

  Call inside the replica function, in the same order in every replica.
  """
  if NumReplicasInSync() == 1:
    return values
  flat = tf.nest.flatten(values)
  reduced = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, flat)
  return tf.nest.pack_sequence_as(values, reduced)


def ShardRows(batch: Any, replica: int, num_replicas: int) -> Any:
  """Rows [r n, (r + 1) n) of every tensor of a global batch (axis 0).

  Raises:
    ValueError: if the batch does not split into `num_replicas` equal parts.
  """
  if num_replicas == 1:
    return batch
  sizes = {int(x.shape[0]) for x in tf.nest.flatten(batch)
           if isinstance(x, tf.Tensor) and x.shape.rank}
  if len(sizes) != 1:
    raise ValueError(f'the batch tensors disagree on the batch size: '
                     f'{sorted(sizes)}')
  size = sizes.pop()
  if size % num_replicas:
    raise ValueError(
        f'global batch size {size} is not divisible by {num_replicas} '
        f'replicas; use a batch size that is a multiple of {num_replicas}')
  n = size // num_replicas
  return tf.nest.map_structure(
      lambda x: x[replica * n:(replica + 1) * n]
      if isinstance(x, tf.Tensor) and x.shape.rank else x, batch)


def Checksums(variables: Sequence[tf.Variable]) -> tf.Tensor:
  """Per-variable fingerprint [len(variables)] of the exact bits (int64).

  Sums of the values' bit patterns with position weights: equal weights give
  equal fingerprints, and a change of any element changes its fingerprint
  except with negligible probability.
  """
  sums = []
  for v in variables:
    x = tf.reshape(tf.convert_to_tensor(v), [-1])
    if x.dtype.size == 8:
      bits = tf.bitcast(x, tf.int64)
    elif x.dtype.size == 2:
      bits = tf.cast(tf.bitcast(x, tf.int16), tf.int64)
    elif x.dtype.size == 1:
      bits = tf.cast(x, tf.int64)
    else:
      bits = tf.cast(tf.bitcast(x, tf.int32), tf.int64)
    weights = tf.range(1, tf.size(bits, out_type=tf.int64) + 1) * 2654435761
    sums.append(tf.reduce_sum(bits * weights))
  return tf.stack(sums) if sums else tf.zeros([0], tf.int64)


def CheckReplicasEqual(topology: Topology,
                       variables_per_replica: Sequence[Sequence[tf.Variable]],
                       names: Sequence[str], when: str) -> None:
  """Raises if the replicas' weights differ anywhere (bitwise).

  Compares this process's copies directly and, across processes, the
  fingerprints of every replica (all-gathered).

  Args:
    topology: the run's topology.
    variables_per_replica: per local replica, its variables in one order.
    names: the variables' paths, in that order (for the message).
    when: e.g. 'after initialisation', 'after restoring ckpt-40'.

  Raises:
    RuntimeError: naming the first variables that differ.
  """
  local = [Checksums(vs).numpy() for vs in variables_per_replica]
  differ = set()
  for sums in local[1:]:
    differ.update(np.nonzero(sums != local[0])[0].tolist())
  if topology.num_replicas > topology.num_local_replicas:
    strategy = topology.strategy

    def Gather():
      sums = tf.constant(local[0])[tf.newaxis]
      return tf.distribute.get_replica_context().all_gather(sums, axis=0)
    every = strategy.experimental_local_results(
        strategy.run(tf.function(Gather)))[0].numpy()    # [R, variables]
    differ.update(np.nonzero((every != every[:1]).any(axis=0))[0].tolist())
  if differ:
    bad = [names[i] for i in sorted(differ)]
    raise RuntimeError(
        f'the {topology.num_replicas} replicas hold different weights '
        f'{when}: {", ".join(bad[:5])}{" ..." if len(bad) > 5 else ""}; '
        'every worker must run the same experiment, Params and checkpoint')


def CopyReplicaZero(variables_per_replica: Sequence[Sequence[tf.Variable]]
                    ) -> None:
  """Assigns local replica 0's values to the other local replicas."""
  first = variables_per_replica[0]
  for others in variables_per_replica[1:]:
    for src, dst in zip(first, others):
      dst.assign(src)


def GlobalMetrics(metrics: Dict[str, Any]) -> Dict[str, Any]:
  """All-reduces (value, weight) metric pairs into global weighted means.

  With one replica the pairs are returned unchanged (no rounding). Sums are
  float32, float64 for a float64 value (py_utils.AccumulationDtype).
  """
  if NumReplicasInSync() == 1:
    return dict(metrics)
  names = sorted(metrics)
  dtypes = [py_utils.AccumulationDtype(tf.convert_to_tensor(
      metrics[k][0]).dtype) for k in names]
  pairs = [(tf.cast(metrics[k][0], d) * tf.cast(metrics[k][1], d),
            tf.cast(metrics[k][1], d)) for k, d in zip(names, dtypes)]
  pairs = AllReduceSum(pairs)
  return {k: (s / tf.maximum(w, 1e-30), w) for k, (s, w) in zip(names, pairs)}


def RunReplicas(topology: Topology, fn: Callable[..., Any], *args) -> Any:
  """strategy.run(fn, args) with the caller's FProp context in every replica.

  Returns local replica 0's results (the replicas agree on everything that
  was all-reduced).
  """
  ctx = py_utils.CaptureContext()
  out = topology.strategy.run(py_utils.WithContext(ctx, fn), args=args)
  return tf.nest.map_structure(
      lambda v: topology.strategy.experimental_local_results(v)[0], out)



def _OnDevice(x: tf.Tensor, device: str) -> tf.Tensor:
  if isinstance(x, tf.IndexedSlices):
    x = tf.convert_to_tensor(x)
  with tf.device(device):
    return tf.identity(x)


def _AddOnDevice(a: tf.Tensor, b: Any, device: str) -> tf.Tensor:
  with tf.device(device):
    return a + tf.convert_to_tensor(b)


def _CheckGrads(grads, variables, names) -> None:
  missing = [n for g, n in zip(grads, names) if g is None]
  if missing:
    raise ValueError(f'no gradient for {missing}: these weights do not '
                     'affect the loss; make them non-trainable')


def TrainStep(topology: Topology, tasks: Sequence[Any],
              optimizers: Sequence[Any], batch: Any, lr: tf.Tensor,
              grad_norm_clip: float = 0.0,
              stop: Optional[tf.Tensor] = None) -> Dict[str, tf.Tensor]:
  """One synchronous step of every replica on the global `batch`.

  Call inside a tf.function, in the step's context (`TrainingMode`,
  `StepSeed`, drop-path progress: they are carried into the replica
  threads). Replica r trains on rows [r n, (r + 1) n) of `batch` with the
  pseudo-code of the module docstring.

  Args:
    topology: the run's topology.
    tasks: one task per local replica (`BuildReplicas`).
    optimizers: one optimizer per local replica, built for its task.
    batch: the global batch (NestedMap of tensors, batch on axis 0).
    lr: the learning rate of this step.
    grad_norm_clip: clip the all-reduced gradients to this global norm;
      0 disables clipping.
    stop: optional float32 scalar, this process's stop flag (preemption.py):
      summed over the replicas in the loss weight's all-reduce (no extra
      collective) and returned as STOP_VOTES.

  Returns:
    Global metrics: every task metric as its weighted mean over all
    replicas, plus 'grad_norm' (before clipping) and 'total_loss'; with
    `stop`, STOP_VOTES too (> 0: some process asked to stop).
  """
  num_replicas = topology.num_replicas

  def Replica(batch):
    local = LocalReplicaIndex(topology)
    task, opt = tasks[local], optimizers[local]
    rows = ShardRows(batch, topology.first_replica + local, num_replicas)
    n = int(tf.nest.flatten(rows)[0].shape[0])
    variables = task.trainable_variables
    with tf.GradientTape() as tape:
      with py_utils.ReplicaExampleOffset(n):
        out = task.FPropDefaultTheta(rows)
      # In the loss's dtype: float64 in a float64 model.
      weight = tf.cast(out.metrics.loss[1], out.loss.dtype)
      if stop is None:
        total_weight = AllReduceSum(weight)
      else:
        # One [2] tensor made in the replica (a captured input has no
        # device for the collective); the weight's sum is unchanged.
        both = AllReduceSum(tf.stack([weight, tf.cast(stop, weight.dtype)]))
        total_weight, votes = both[0], both[1]
      # R = 1: weight / total_weight == 1.0 exactly.
      objective = out.loss * (weight / total_weight)
    with tf.GradientTape() as reg_tape:
      reg = task.RegularizationLoss()
    grads = tape.gradient(objective, variables)
    reg_grads = reg_tape.gradient(reg, variables)
    _CheckGrads([g if g is not None else r for g, r in zip(grads, reg_grads)],
                variables, [v.name for v in variables])
    # Pinned to their stage's device, stage k's gradients are all-reduced
    # there (the strategy reduces each value on its first replica's copy and
    # broadcasts to the copies' devices), not on the replica's first device.
    grads = [_OnDevice(tf.zeros_like(v) if g is None else g, v.device)
             for g, v in zip(grads, variables)]
    grads = AllReduceSum(grads)
    # The regulariser's gradient is the same in every replica: added once,
    # after the all-reduce, the sum is data + regulariser as with R = 1 (two
    # terms add exactly alike in any order), so replicated runs can equal
    # the single-process one bit for bit (grad_sum.py).
    grads = [g if r is None else _AddOnDevice(g, r, v.device)
             for g, r, v in zip(grads, reg_grads, variables)]
    grad_norm = tf.linalg.global_norm(grads)
    if grad_norm_clip:
      grads, _ = tf.clip_by_global_norm(grads, grad_norm_clip,
                                        use_norm=grad_norm)
    opt.Apply(lr, grads, variables)
    values = {k: v[0] for k, v in GlobalMetrics(dict(out.metrics)).items()}
    values['total_loss'] = AllReduceSum(out.loss * (weight / total_weight)) + reg
    if task.params.train.l2_regularizer_weight:
      values['l2_loss'] = reg
    values['grad_norm'] = grad_norm
    if stop is not None:
      values[STOP_VOTES] = votes
    return values

  return RunReplicas(topology, Replica, batch)


def ConnectRemoteStages(worker_addresses: Sequence[str]) -> List[str]:
  """EXPERIMENTAL: stages on other hosts, driven by this single client.

  Connects this process (the client) to running TensorFlow servers
  (`tf.distribute.Server` in job 'worker', one per address) and returns one
  device per server, '/job:worker/replica:0/task:<i>/device:CPU:0' (GPU:0 if
  the server has one), to use as a TensorPipeLayer's `devices`: partition k
  then runs on host k, and TF's runtime sends the boundary activations
  between hosts. Limits: one client builds and runs every step (no data
  parallelism in this mode; the variables live on the servers and die with
  them), the servers must be started first and stay up, and every step
  crosses the network 2 (K - 1) times per micro-batch. Call before any
  other TensorFlow op.

  Args:
    worker_addresses: 'host:port' of each server, in stage order.

  Returns:
    K device names.
  """
  from tensorpipe import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  addresses = [cluster_lib.CheckAddress(a, f'worker[{i}]')
               for i, a in enumerate(worker_addresses)]
  if not addresses:
    raise ValueError('worker_addresses is empty; give one "host:port" per '
                     'stage')
  spec = tf.train.ClusterSpec({'worker': addresses})
  tf.config.experimental_connect_to_cluster(spec)
  names = []
  for i in range(len(addresses)):
    task = f'/job:worker/replica:0/task:{i}'
    gpus = [d for d in tf.config.list_logical_devices('GPU')
            if d.name.startswith(task + '/')]
    names.append(f'{task}/device:GPU:0' if gpus else f'{task}/device:CPU:0')
  return names
