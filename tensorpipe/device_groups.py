"""One process, R device groups: R data-parallel replicas of a K-stage pipeline.

On one host the R x K layout of a multi-worker run (cluster.py) can run in
one process: `SplitDeviceGroups` cuts the local devices into R groups of K
(group r: devices r K .. (r + 1) K - 1, replica r's partitions) and
`MirroredStrategyOverGroups` mirrors over the groups' first devices, so
each replica pipelines over its own group and the strategy all-reduces the
gradients. `SplitDeviceGroups` is pure Python; the others import
TensorFlow when called.

Usage:
  groups = LocalDeviceGroups(num_replicas=2, num_partitions=4)
  strategy = MirroredStrategyOverGroups(groups)
"""

from typing import Any, List, Sequence

from tensorpipe import checks


def SplitDeviceGroups(devices: Sequence[str], num_replicas: int,
                      num_partitions: int) -> List[List[str]]:
  """Cuts local devices into R groups of K: group r = devices[r K : (r+1) K].

  Args:
    devices: the local devices in order, e.g. ['/CPU:0', ..., '/CPU:7'].
    num_replicas: R.
    num_partitions: K, the pipeline stages of each replica.

  Returns:
    R lists of K device names; extra devices are left out.

  Raises:
    ValueError: R or K < 1, or fewer than R x K devices.
  """
  checks.CheckPositiveInts('', num_replicas=num_replicas,
                           num_partitions=num_partitions)
  devices = list(devices)
  need = num_replicas * num_partitions
  if len(devices) < need:
    raise ValueError(
        f'{num_replicas} replicas x {num_partitions} partitions need {need} '
        f'devices but only {len(devices)} are visible ({devices}); without '
        f'accelerators pass --num_cpu_devices={need} (or call '
        f'tensorpipe.SetNumLogicalCpuDevices({need}) at program start), or '
        'use fewer replicas or partitions')
  k = num_partitions
  return [devices[r * k:(r + 1) * k] for r in range(num_replicas)]


def LocalDeviceGroups(num_replicas: int, num_partitions: int) -> List[List[str]]:
  """SplitDeviceGroups over this host's GPUs, else its logical CPUs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  found = (tf.config.list_logical_devices('GPU') or
           tf.config.list_logical_devices('CPU'))
  return SplitDeviceGroups([d.name for d in found], num_replicas,
                           num_partitions)


def MirroredStrategyOverGroups(groups: Sequence[Sequence[str]]) -> Any:
  """MirroredStrategy with one replica per device group (its first device).

  Each replica's pipeline places its stages on its own group; the strategy
  mirrors only the groups' first devices (where MirroredStrategy puts a
  replica's variables and runs its replica function).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  groups = [list(g) for g in groups]
  if not groups or any(not g for g in groups):
    raise ValueError(f'groups={groups!r} must be a non-empty list of '
                     'non-empty device lists (SplitDeviceGroups)')
  sizes = sorted({len(g) for g in groups})
  if len(sizes) != 1:
    raise ValueError(f'device groups have different sizes {sizes}; every '
                     'replica needs the same number of partitions')
  firsts = [g[0] for g in groups]
  kinds = {tf.DeviceSpec.from_string(d).device_type for d in firsts}
  # On GPUs the strategy's default (NCCL) is right. On CPUs the default is
  # picked with a warning; ReductionToOneDevice() reduces each value on the
  # device of its first replica's copy (stage k's values on stage k's device).
  cross = None if kinds == {'GPU'} else tf.distribute.ReductionToOneDevice()
  return tf.distribute.MirroredStrategy(devices=firsts,
                                        cross_device_ops=cross)
