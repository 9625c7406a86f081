"""Devices for pipeline partitions: accelerators if present, else logical CPUs."""

from typing import List, Optional, Sequence

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


def ResolveDevices(devices: Optional[Sequence[str]], num: int) -> List[str]:
  """Checks user-given devices or picks the defaults."""
  if devices is None or len(devices) == 0:  # pylint: disable=g-explicit-length-test
    return DefaultDevices(num)
  devices = list(devices)
  if len(devices) != num:
    raise ValueError(f'devices={devices} has {len(devices)} entries for {num} '
                     f'partitions; give exactly one device per partition')
  for d in devices:
    if not isinstance(d, str):
      raise TypeError(f'device {d!r} is not a string such as "/CPU:1"')
    try:
      tf.DeviceSpec.from_string(d)
    except ValueError:
      raise ValueError(f'device {d!r} is not a valid device name; use names '
                       'like "/GPU:0" or "/job:worker/task:1/device:CPU:0"'
                       ) from None
  return devices
