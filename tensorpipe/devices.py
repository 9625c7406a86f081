"""Devices for pipeline partitions: accelerators if present, else logical CPUs."""

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf


def SetNumLogicalCpuDevices(num: int) -> None:
  """Splits the host CPU into `num` logical devices /CPU:0 .. /CPU:num-1.

  Must run before TensorFlow initialises its devices (before any op runs).

  Raises:
    ValueError: num < 1.
    RuntimeError: TensorFlow already initialised with a different count.
  """
  if not isinstance(num, int) or num < 1:
    raise ValueError(f'num logical CPU devices must be a positive int, got '
                     f'{num!r}')
  cpus = tf.config.list_physical_devices('CPU')
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num)
  except RuntimeError:
    have = len(tf.config.list_logical_devices('CPU'))
    if have != num:
      raise RuntimeError(
          f'TensorFlow is already initialised with {have} logical CPU devices, '
          f'so {num} cannot be set any more; call '
          'tensorpipe.SetNumLogicalCpuDevices() at program start, before any '
          'TensorFlow op runs') from None


def DefaultDevices(num: int) -> List[str]:
  """The first `num` GPUs, else TPU cores, else logical CPUs.

  Raises:
    ValueError: fewer devices than `num`, with the fix.
  """
  for kind in ('GPU', 'TPU'):
    found = tf.config.list_logical_devices(kind)
    if found:
      if len(found) < num:
        raise ValueError(
            f'{num} partitions need {num} devices but only {len(found)} {kind}s '
            f'are visible ({[d.name for d in found]}); use num_partitions <= '
            f'{len(found)} or pass `devices` explicitly')
      return [d.name for d in found[:num]]
  cpus = tf.config.list_logical_devices('CPU')
  if len(cpus) < num:
    raise ValueError(
        f'{num} partitions need {num} devices but only {len(cpus)} logical '
        f'CPU device(s) are visible and no GPU/TPU; call '
        f'tensorpipe.SetNumLogicalCpuDevices({num}) at program start (or use '
        f'--num_cpu_devices={num} with the trainer), use num_partitions <= '
        f'{len(cpus)}, or pass `devices` explicitly')
  return [d.name for d in cpus[:num]]


def Matches(spec: tf.DeviceSpec, device: tf.DeviceSpec) -> bool:
  """Whether every field `spec` names equals `device`'s (local: localhost)."""
  have = {'job': device.job or 'localhost',
          'replica': 0 if device.replica is None else device.replica,
          'task': 0 if device.task is None else device.task,
          'device_type': device.device_type,
          'device_index': device.device_index}
  return all(getattr(spec, field) is None or getattr(spec, field) == value
             for field, value in have.items())


def NumProcesses(devices: Sequence[str]) -> int:
  """The processes (job, replica, task) the devices sit in; a name without
  a job is this process's ('/CPU:1': localhost, task 0)."""
  return len({_ProcessKey(tf.DeviceSpec.from_string(name))
              for name in devices})


def _ProcessKey(spec: tf.DeviceSpec) -> Tuple[str, int, int]:
  """(job, replica, task) of a device; no job: this process (localhost, 0,
  0)."""
  return (spec.job or 'localhost', spec.replica or 0, spec.task or 0)


def SharedDevices(devices: Sequence[str]) -> List[Tuple[str, List[int]]]:
  """The devices named more than once, with the positions naming each.

  '/CPU:0', '/device:CPU:0' and '/job:localhost/replica:0/task:0/device:CPU:0'
  name the same device. Returns [(first name given, [positions])], in order
  of first appearance; [] when the devices are distinct.
  """
  groups = {}
  for i, name in enumerate(devices):
    spec = tf.DeviceSpec.from_string(name)
    key = _ProcessKey(spec) + ((spec.device_type or '').upper(),
                               spec.device_index or 0)
    groups.setdefault(key, (name, []))[1].append(i)
  return [(name, where) for name, where in groups.values() if len(where) > 1]


def CheckDeviceExists(name: str) -> None:
  """Raises unless `name` matches a logical device TensorFlow can place on.

  Local names ('/CPU:1', '/GPU:0') are checked against this process's
  logical devices; job-qualified names ('/job:worker/replica:0/task:1/
  device:CPU:0') against the remote devices listed once a cluster is
  connected with `tf.config.experimental_connect_to_cluster`. Without the
  check TensorFlow's soft placement would silently run the ops on /CPU:0.

  Args:
    name: a device name such as "/GPU:0" or "/job:worker/task:1/device:CPU:0".

  Raises:
    TypeError: `name` is not a string.
    ValueError: `name` is not a device name, names no device, or matches none
      of the existing devices (the message lists them).
  """
  if not isinstance(name, str):
    raise TypeError(f'device {name!r} is not a string such as "/CPU:1"')
  try:
    spec = tf.DeviceSpec.from_string(name)
  except ValueError:
    raise ValueError(f'device {name!r} is not a valid device name; use names '
                     'like "/GPU:0" or "/job:worker/task:1/device:CPU:0"'
                     ) from None
  if not any((spec.job, spec.replica is not None, spec.task is not None,
              spec.device_type, spec.device_index is not None)):
    raise ValueError(f'device {name!r} names no device; use names like '
                     '"/GPU:0" or "/CPU:1"')
  existing = [d.name for d in tf.config.list_logical_devices()]
  if any(Matches(spec, tf.DeviceSpec.from_string(d)) for d in existing):
    return
  hint = ''
  if spec.job and spec.job != 'localhost':
    hint = ('; for a remote device connect to its cluster first '
            '(tf.config.experimental_connect_to_cluster)')
  elif spec.device_type == 'CPU':
    hint = ('; for more logical CPU devices call tensorpipe.'
            'SetNumLogicalCpuDevices(n) at program start (the trainer: '
            '--num_cpu_devices=n)')
  raise ValueError(f'device {name!r} does not exist on this machine; the '
                   f'devices are {existing}: use one of them{hint}')


def ResolveDevices(devices: Optional[Sequence[str]], num: int) -> List[str]:
  """Checks user-given devices or picks the defaults.

  Args:
    devices: one device name per partition, or None / [] for the defaults.
    num: K, the number of partitions.

  Returns:
    K device names.

  Raises:
    TypeError / ValueError: a wrong count, or a name that is not a device of
      this machine (or of the connected cluster), with the fix.
  """
  if devices is None or len(devices) == 0:  # pylint: disable=g-explicit-length-test
    return DefaultDevices(num)
  if isinstance(devices, str):
    raise TypeError(f'devices={devices!r} is a string; give a list with one '
                    f'device per partition, e.g. {[devices]!r}')
  devices = list(devices)
  if len(devices) != num:
    raise ValueError(f'devices={devices} has {len(devices)} entries for {num} '
                     f'partitions; give exactly one device per partition')
  for d in devices:
    CheckDeviceExists(d)
  return devices
