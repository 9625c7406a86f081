"""Export of a trainer's run: its Params, its newest checkpoint, a SavedModel.

`ExportRun(experiment_params, model_key, logdir, export_dir)` is what
tools/export.py does with a training run: rebuild the task from the run's
params.txt (`RunParams`, so --model_params_override values are honoured),
place it for serving (`SetServingDevices` for a pipeline over K devices,
`SetServingDevice` for one), restore the newest intact checkpoint
(checkpoints.RestoreNewest) and write the task's model with
`export.ExportModel`, inputs named after the batch key the task reads
(`image` for the image tasks, `TaskInputSpecs`), plus the raw-image
signature of an image experiment (`RawSignature`). Every check that needs
no TensorFlow comes first.

Usage:
  result = ExportRun(GetExperiment(key).ModelParams(), key, logdir,
                     '/tmp/export')
"""

import os
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checkpoints
from tensorpipe import distribute
from tensorpipe import errors
from tensorpipe import export
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import overrides
from tensorpipe import params_format
from tensorpipe import pipeline
from tensorpipe import tasks
from tensorpipe.export import ExportError


def RunParams(experiment_params: hyperparams.Params, logdir: str,
              model_key: str, params_override: str = '') -> hyperparams.Params:
  """The Params of the run in `logdir`: the experiment's, with params.txt.

  Args:
    experiment_params: `GetExperiment(model_key).ModelParams()`.
    logdir: the trainer's logdir (holding params.txt).
    model_key: the registry key, for messages.
    params_override: --model_params_override text applied after params.txt,
      e.g. "task.model.schedule='/copy/of/z.csv'" for a run that recorded a
      CSV schedule's path (before the trainer recorded the table itself).

  Returns:
    A copy of experiment_params with every value of params.txt set, so the
    run's --model_params_override values are honoured.

  Raises:
    ExportError: no params.txt, one of another experiment, or a CSV
      schedule file that cannot be read (naming the override to pass).
    ValueError: a bad params_override.
  """
  path = os.path.join(logdir, logdir_lib.PARAMS_FILE)
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    has_ckpt = os.path.isdir(os.path.join(logdir, checkpoints.CHECKPOINT_DIR))
    raise ExportError(
        f'{path} does not exist: {logdir} is not a trainer logdir'
        f'{" (it has checkpoints but no params.txt)" if has_ckpt else ""}; '
        'pass the --logdir the trainer wrote (train first with python -m '
        'tools.trainer)') from None
  p = experiment_params.Copy()
  run_name = logdir_lib.ReadExperimentName(logdir)
  if run_name != p.name:
    raise ExportError(
        f'{logdir} holds a run of experiment {run_name!r} (its params.txt), '
        f'not of --model={model_key} ({p.name}); pass the --model that '
        'trained it')
  # A line of another form is reported by FromText below.
  saved = params_format.TextValues(text, skip_malformed=True)
  ours = params_format.TextValues(p.ToText())
  missing = sorted(set(ours) - set(saved))
  extra = sorted(set(saved) - set(ours))
  if missing or extra:
    what = ([f'{k} (not in params.txt)' for k in missing[:4]] +
            [f'{k} (only in params.txt)' for k in extra[:4]])
    raise ExportError(
        f'{path} does not fit --model={model_key}: {", ".join(what)}'
        f'{" and more" if len(missing) + len(extra) > 8 else ""}; pass the '
        '--model that trained this run')
  try:
    p.FromText(text)
  except (ValueError, TypeError, AttributeError) as e:
    raise ExportError(f'{path} does not fit --model={model_key}: '
                      f'{errors.FirstLine(e)}; pass the --model '
                      'that trained this run') from None
  overrides.ApplyOverrides(p, params_override)
  return p


def _CheckScheduleFiles(p: hyperparams.Params, params_path: str) -> None:
  """Every CSV schedule named by a path can be read.

  Export never runs the table's order, but building a pipeline of several
  devices reads the table for its stage placement. Runs trained before the
  trainer recorded the table itself (`schedules.CsvParam`) name only the
  file.
  """
  for key, value in params_format.TextValues(p.ToText()).items():
    if key.rpartition('.')[2] != 'schedule' or len(value) < 2:
      continue
    path = value[1:-1]
    if not overrides.IsCsvSchedulePath(path) or os.path.isfile(path):
      continue
    raise ExportError(
        f'{key}={path!r} ({params_path}) cannot be read: building the '
        "pipeline reads the schedule's table for its stage placement; pass "
        f"--model_params_override=\"{key}='/path/to/copy.csv'\" naming a "
        'copy of that table (runs trained now record the table in '
        'params.txt)')


def PipelineParams(task_params: hyperparams.Params) -> Optional[
    hyperparams.Params]:
  """The task's model Params if it is a TensorPipeLayer, else None."""
  mp = task_params.model
  if isinstance(mp, hyperparams.InstantiableParams) and issubclass(
      mp.cls, pipeline.TensorPipeLayer):
    return mp
  return None


def NumPartitions(task_params: hyperparams.Params) -> int:
  """K of the task's pipeline (1 for a model that is not one)."""
  mp = PipelineParams(task_params)
  return 1 if mp is None else distribute.NumPartitions(mp)


def SetServingDevices(task_params: hyperparams.Params,
                      devices: Optional[Sequence[str]],
                      num_partitions: Optional[int] = None) -> None:
  """Places the task's pipeline for pipelined serving (in place).

  Args:
    task_params: the task Params (mutable).
    devices: one name per partition, or None for the defaults.
    num_partitions: K for serving; may differ from training's K when the
      pipeline is partitioned automatically (`layers`): variables are named
      by layer, so the checkpoint restores under any K.

  Raises:
    ExportError: the model is no pipeline, or K does not fit it.
  """
  mp = PipelineParams(task_params)
  if mp is None:
    raise ExportError('pipelined serving needs a TensorPipeLayer model; this '
                      f'task\'s model is {task_params.model.cls.__name__}: '
                      'export it on one device')
  k = num_partitions or (len(devices) if devices else NumPartitions(
      task_params))
  if mp.partitions is not None:
    if k != len(mp.partitions):
      raise ExportError(
          f'the model is split by hand into {len(mp.partitions)} partitions; '
          f'it cannot be served on {k} devices: use {len(mp.partitions)} '
          'devices, or one')
  else:
    if k > len(mp.layers):
      raise ExportError(f'{k} devices for a model of {len(mp.layers)} '
                        f'layers; use at most {len(mp.layers)}')
    if k > 1 and mp.input_shapes is None:
      raise ExportError('automatic partitioning over several devices needs '
                        'task.model.input_shapes; set it or serve on one '
                        'device')
    mp.num_partitions = k
  mp.devices = list(devices) if devices else None


def SetServingDevice(task_params: hyperparams.Params,
                     devices: Optional[Sequence[str]]) -> str:
  """Places the task's model on one serving device (in place); returns it.

  Args:
    task_params: the task Params (mutable).
    devices: None (the default device) or one device name.

  Raises:
    ExportError: more than one device.
  """
  if devices and len(devices) != 1:
    raise ExportError(f'devices={list(devices)}: serving on one device '
                      'takes one device name; pipelined serving takes one '
                      'per partition')
  device = devices[0] if devices else export.DefaultServingDevice()
  mp = PipelineParams(task_params)
  if mp is not None:
    # Built where it is served, no other device needed; an automatic
    # split is not computed at all (the layers are chained anyway), nor
    # the training schedule's placement (a CSV table has K rows).
    if mp.partitions is None:
      mp.num_partitions = 1
      mp.Set(schedule='gpipe', num_stages_per_device=1)
    mp.devices = [device] * NumPartitions(task_params)
  return device


def TaskInputSpecs(task: base_layer.BaseLayer) -> Dict[str, tf.TensorSpec]:
  """{input name: spec} of a classification task's model, batch axis None.

  The name is the batch key the task feeds the model (`image`); the shape
  comes from the pipeline's input_shapes.

  Raises:
    ExportError: not a ClassificationTask, or no input_shapes to take the
      shape from.
  """
  p = task.params
  if not isinstance(task, tasks.ClassificationTask):
    raise ExportError(
        f'export serves classification tasks (their model maps batch.'
        f'<input_key> to logits); {type(task).__name__} {p.name!r} is not '
        'one: call export.ExportModel with its own input_specs and outputs')
  model = task.children.model
  shapes = getattr(model.params, 'input_shapes', None)
  if not shapes or len(shapes) != 1 or not isinstance(shapes[0],
                                                      (list, tuple)):
    raise ExportError(
        f'task.model.input_shapes={shapes!r} does not give the shape of '
        f'batch.{p.input_key}; set it to [[batch, height, width, channels]] '
        '(or call export.ExportModel with input_specs)')
  shape = [None] + list(shapes[0])[1:]
  return {p.input_key: tf.TensorSpec(shape, tf.float32)}


def RawSignature(run_params: hyperparams.Params,
                 input_specs: Dict[str, tf.TensorSpec]
                 ) -> Optional[export.RawImages]:
  """The raw-image signature of a run whose eval input can preprocess one
  (image experiments: `ServingPreprocess`), else None."""
  eval_input = run_params.eval_input.Instantiate()
  preprocess = getattr(eval_input, 'ServingPreprocess', None)
  if preprocess is None or len(input_specs) != 1:
    return None
  (name,) = input_specs
  return export.RawImages(name, tuple(eval_input.RawImageShape()), preprocess)


class ExportResult(NamedTuple):
  export_dir: str
  checkpoint: str            # the checkpoint path restored
  step: int                  # its global step
  mode: str                  # 'one_device' or 'pipelined'
  input_specs: Dict[str, tf.TensorSpec]


def _CheckpointsOf(logdir: str, log_fn) -> List[int]:
  ckpt_dir = os.path.join(logdir, checkpoints.CHECKPOINT_DIR)
  numbers = checkpoints.Candidates(ckpt_dir, log_fn)
  if not numbers:
    raise checkpoints.NoCheckpointError(
        f'no checkpoint in {ckpt_dir}: nothing to export; check --logdir, '
        'or train first (python -m tools.trainer ...)')
  return numbers


def ExportRun(experiment_params: hyperparams.Params, model_key: str,
              logdir: str, export_dir: str, pipelined: bool = False,
              devices: Optional[Sequence[str]] = None,
              num_partitions: Optional[int] = None,
              serving_batch_size: Optional[int] = None,
              overwrite: bool = False,
              log_fn: Callable[[str], None] = print,
              raw_images: bool = True,
              params_override: str = '') -> ExportResult:
  """Exports the newest intact checkpoint of a trainer's run.

  Every check that needs no TensorFlow comes first: the export folder, the
  run's params.txt against the experiment, a checkpoint to restore.

  Args:
    experiment_params: `GetExperiment(model_key).ModelParams()`.
    model_key: its registry key (for messages and the export's record).
    logdir: the run's logdir.
    export_dir: the SavedModel folder to write.
    pipelined: serve through the pipeline on `devices` (None: the default
      K devices) with `num_partitions` partitions (None: the run's K);
      else on one device, `devices[0]` if given.
    serving_batch_size: rows per pipeline call (pipelined; default the
      run's input.batch_size).
    overwrite: replace a non-empty export_dir.
    log_fn: progress and warnings (e.g. damaged checkpoints skipped).
    raw_images: for an image experiment, also write export.RAW_SIGNATURE_KEY,
      taking uint8 images and applying the eval input's preprocessing.
    params_override: see `RunParams`.

  Returns:
    ExportResult.

  Raises:
    ExportError: a bad export_dir, params.txt of another experiment, a
      pipelined placement or chunk size that does not fit.
    checkpoints.NoCheckpointError: the logdir has no checkpoint.
    checkpoints.IncompatibleCheckpointError: its variables are not this
      model's (another experiment or config).
    checkpoints.CheckpointError: every checkpoint is damaged.
  """
  export.CheckExportDir(export_dir, overwrite)
  p = RunParams(experiment_params, logdir, model_key, params_override)
  _CheckpointsOf(logdir, log_fn)
  device = None
  if pipelined:
    SetServingDevices(p.task, devices, num_partitions)
    if serving_batch_size is None:
      serving_batch_size = p.input.batch_size
  else:
    device = SetServingDevice(p.task, devices)
  _CheckScheduleFiles(p, os.path.join(logdir, logdir_lib.PARAMS_FILE))
  task = p.task.Instantiate()
  step = tf.Variable(0, dtype=tf.int64, trainable=False, name='global_step')
  ckpt_dir = os.path.join(logdir, checkpoints.CHECKPOINT_DIR)

  def RunDescription() -> str:
    return (f'a run of {logdir_lib.ReadExperimentName(logdir) or "another model"}'
            ' whose checkpoint is not of the model its params.txt describes')
  path = checkpoints.RestoreNewest(
      tf.train.Checkpoint(model=task, global_step=step),
      dict(model=task, global_step=step), ckpt_dir,
      lambda m: log_fn(f'WARNING: {m}'), RunDescription)
  if path is None:  # removed since the check above
    _CheckpointsOf(logdir, log_fn)
  input_specs = TaskInputSpecs(task)
  raw = RawSignature(p, input_specs) if raw_images else None
  with open(os.path.join(logdir, logdir_lib.PARAMS_FILE)) as f:
    params_text = f.read()
  info = dict(model=model_key, logdir=os.path.abspath(logdir),
              checkpoint=path, step=int(step.numpy()))
  export.ExportModel(task.children.model, export_dir, input_specs,
                     pipelined=pipelined, device=device,
                     serving_batch_size=serving_batch_size,
                     overwrite=overwrite, info=info,
                     extra_files={export.PARAMS_COPY: params_text}, raw=raw)
  mode = 'pipelined' if pipelined else 'one_device'
  log_fn(f'exported {path} (step {int(step.numpy())}) of {model_key} to '
         f'{export_dir} ({mode}; inputs '
         f'{", ".join(f"{n} {s.shape}" for n, s in input_specs.items())})')
  return ExportResult(export_dir, path, int(step.numpy()), mode, input_specs)
