"""SavedModel export of a trained model, for serving without TensorPipe.

`ExportModel(model, export_dir, input_specs)` is the core: it takes a built
layer whose variables hold the trained weights (a TensorPipeLayer or any
BaseLayer) and writes a SavedModel with one signature, `serving_default`,
that runs the model in inference mode (`py_utils.EvalMode`: batch norm on
its moving averages, dropout off) and returns a dict of tensors (default
`ClassifierOutputs`: `logits` and `probabilities`). The SavedModel holds
only TensorFlow graphs and variables: plain `tf.saved_model.load(dir)` runs
it in a process that cannot import tensorpipe. Any front end that builds a
model (the trainer's tasks, a Keras wrapper) exports through it.

`export_run.ExportRun(experiment_params, model_key, logdir, export_dir)` is
what tools/export.py does with a training run: rebuild the task from the
run's params.txt (so --model_params_override values are honoured), restore
the newest intact checkpoint (checkpoints.RestoreNewest) and export the
task's model through `ExportModel`, inputs named after the batch key the
task reads (`image` for the image tasks).

Two ways to serve, for any request batch size b:

  one device (default): the model's layers chained without the pipeline
    (`LayersWithTheta`), every op on `device`:
      y = F_L(...F_1(x))                             # [b, ...], any b
  pipelined: the TensorPipeLayer's own FProp on its K devices, T
    micro-batches per chunk of `serving_batch_size` rows S (a multiple of T):
      x = pad(x, to n = ceil(b / S) chunks of S rows)
      for chunk in x: y[chunk] = pipeline(chunk)     # tf.map_fn, in order
      y = y[:b]                                      # padding rows dropped

In inference mode every example's output depends on that example alone, so
padding and chunking do not change any row (up to float rounding, which may
differ between batch sizes).

Usage:
  task = ...   # built, checkpoint restored
  ExportModel(task.model, '/tmp/export',
              {'image': tf.TensorSpec([None, 28, 28, 1], tf.float32)})
  # later, anywhere:
  serve = tf.saved_model.load('/tmp/export').signatures['serving_default']
  probabilities = serve(image=images)['probabilities']
"""

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import errors
from tensorpipe import logdir as logdir_lib
from tensorpipe import microbatch
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe.layers import composite

SIGNATURE_KEY = 'serving_default'
# The signature taking raw uint8 images (image experiments): the eval
# preprocessing is in the graph. Not the default, so that float32 clients of
# serving_default keep working.
RAW_SIGNATURE_KEY = 'serving_raw'
# Written next to the SavedModel's own files (SavedModel's folder for files
# that TensorFlow does not read): what was exported from where.
INFO_FILE = os.path.join('assets.extra', 'tensorpipe_export.json')
PARAMS_COPY = os.path.join('assets.extra', logdir_lib.PARAMS_FILE)

OutputsFn = Callable[[Any], Dict[str, tf.Tensor]]


class ExportError(ValueError):
  """An export that cannot be done as asked (names the value and the fix)."""


def ClassifierOutputs(out: Any) -> Dict[str, tf.Tensor]:
  """{'logits', 'probabilities'} of a classifier's output.

  Args:
    out: logits [b, C], or a dict with key 'logits' (e.g. with aux_logits).
  """
  logits = out['logits'] if isinstance(out, dict) else out
  logits = tf.cast(logits, tf.float32)
  return {'logits': tf.identity(logits, name='logits'),
          'probabilities': tf.nn.softmax(logits, name='probabilities')}


def CheckExportDir(export_dir: str, overwrite: bool = False) -> None:
  """Raises ExportError if export_dir holds files and overwrite is False.

  Call it first: before building or restoring anything.
  """
  if not isinstance(export_dir, str) or not export_dir:
    raise ExportError(f'export_dir={export_dir!r} must be a folder path')
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise ExportError(f'export_dir {export_dir} is a file, not a folder; '
                      'pass a new folder')
  if not overwrite and os.path.isdir(export_dir) and os.listdir(export_dir):
    raise ExportError(
        f'export_dir {export_dir} exists and is not empty; pass a new folder, '
        'or overwrite=True (--overwrite) to replace what is there')


def DefaultServingDevice() -> str:
  """The first GPU, else /CPU:0."""
  gpus = tf.config.list_logical_devices('GPU')
  return gpus[0].name if gpus else '/CPU:0'


def _Chain(model: base_layer.BaseLayer, inputs: Sequence[tf.Tensor]) -> Any:
  """The model's layers one after the other, without a pipeline."""
  if not hasattr(model, 'LayersWithTheta'):
    return model.FProp(model.theta, *inputs)
  args = tuple(inputs)
  for layer, theta in model.LayersWithTheta():
    args = composite.AsArgs(layer.FProp(theta, *args))
  return composite.FromArgs(args)


def _Specs(structure: Any) -> Any:
  return tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), structure)


def _CheckInputSpecs(input_specs: Dict[str, tf.TensorSpec]) -> None:
  if not isinstance(input_specs, dict) or not input_specs:
    raise ExportError(f'input_specs={input_specs!r} must be a non-empty dict '
                      "{name: tf.TensorSpec}, e.g. {'image': "
                      'tf.TensorSpec([None, 28, 28, 1], tf.float32)}')
  for name, spec in input_specs.items():
    if not isinstance(spec, tf.TensorSpec):
      raise ExportError(f'input_specs[{name!r}]={spec!r} is not a '
                        'tf.TensorSpec')
    if not isinstance(name, str) or not name.isidentifier():
      raise ExportError(f'input name {name!r} must be an identifier such as '
                        "'image' (it names a signature input)")
    if spec.shape.rank is None or spec.shape.rank < 1:
      raise ExportError(f'input {name!r} has shape {spec.shape}; it needs a '
                        'batch axis first, e.g. [None, 28, 28, 1]')


def _CheckPipelined(model: base_layer.BaseLayer,
                    serving_batch_size: Optional[int]) -> int:
  """The chunk size S of pipelined serving (checks it fits T)."""
  if not isinstance(model, pipeline.TensorPipeLayer):
    raise ExportError(f'pipelined serving needs a TensorPipeLayer model, got '
                      f'{type(model).__name__}; export it on one device')
  p = model.params
  if p.batch_dim != 0:
    raise ExportError(f'pipelined serving splits the batch on axis 0, but '
                      f'the model has batch_dim={p.batch_dim}; export it on '
                      'one device')
  if (serving_batch_size is None or isinstance(serving_batch_size, bool) or
      not isinstance(serving_batch_size, int) or serving_batch_size < 1):
    raise ExportError(f'serving_batch_size={serving_batch_size!r}: pipelined '
                      'serving needs the rows per pipeline call, an int >= 1 '
                      'that the micro-batches divide (e.g. the training '
                      'batch size)')
  try:
    microbatch.NumMicroBatches(serving_batch_size, p.num_micro_batches,
                               p.micro_batch_size)
  except (ValueError, TypeError) as e:
    first = errors.FirstLine(e)
    raise ExportError(f'serving_batch_size={serving_batch_size} does not fit '
                      f'the pipeline: {first}') from None
  return serving_batch_size


def _PaddedChunks(xs: Sequence[tf.Tensor], size: int):
  """Pads rows to a multiple of `size`: ([n, size, ...] per input, b)."""
  b = tf.shape(xs[0])[0]
  n = (b + size - 1) // size
  chunks = []
  for x in xs:
    pad = [[0, n * size - b]] + [[0, 0]] * (x.shape.rank - 1)
    padded = tf.pad(x, pad)
    chunks.append(tf.reshape(padded, tf.concat([[n, size],
                                                tf.shape(x)[1:]], 0)))
  return chunks, b


def _Unchunk(y: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """[n, S, ...] -> the first b rows of [n S, ...]."""
  flat = tf.reshape(y, tf.concat([[-1], tf.shape(y)[2:]], 0))
  return flat[:b]


def ServingFunction(model: base_layer.BaseLayer,
                    input_specs: Dict[str, tf.TensorSpec],
                    pipelined: bool = False, device: Optional[str] = None,
                    serving_batch_size: Optional[int] = None,
                    outputs: OutputsFn = ClassifierOutputs
                    ) -> tf.types.experimental.ConcreteFunction:
  """The concrete serving function (inputs named by input_specs' keys).

  Args:
    model: the built model with its trained weights.
    input_specs: {name: spec} in the order of the model's FProp inputs; the
      batch axis (first) may be None.
    pipelined: run the TensorPipeLayer's pipeline on its own devices, in
      chunks of serving_batch_size rows; else chain the layers on `device`.
    device: the one device (default: the first GPU, else /CPU:0).
    serving_batch_size: rows per pipeline call S (pipelined only).
    outputs: maps the model's output to the signature's dict of tensors.

  Returns:
    A tf.function concrete function, usable as a SavedModel signature.

  Raises:
    ExportError: bad input specs, a model that cannot be pipelined, or a
      chunk size the micro-batches do not divide.
  """
  _CheckInputSpecs(input_specs)
  names = list(input_specs)
  specs = [tf.TensorSpec(s.shape, s.dtype, name=n)
           for n, s in input_specs.items()]
  if pipelined:
    size = _CheckPipelined(model, serving_batch_size)

    def RunChunk(*xs):
      with py_utils.EvalMode():
        return outputs(model.FProp(model.theta, *xs))
    chunk_specs = [tf.TensorSpec([size] + s.shape.as_list()[1:], s.dtype)
                   for s in specs]
    out_specs = _Specs(tf.function(RunChunk, autograph=False)
                       .get_concrete_function(*chunk_specs)
                       .structured_outputs)

    def Serve(*xs):
      chunks, b = _PaddedChunks(xs, size)
      ys = tf.map_fn(lambda c: RunChunk(*c), tuple(chunks),
                     fn_output_signature=out_specs, parallel_iterations=1)
      return {k: _Unchunk(v, b) for k, v in ys.items()}
  else:
    device = device or DefaultServingDevice()

    def Serve(*xs):
      with tf.device(device), py_utils.EvalMode():
        # Some layers cannot take an empty batch (a reshape to [-1, ...]
        # is ambiguous with no elements): run one zero row then, return none.
        b = tf.shape(xs[0])[0]
        xs = [tf.cond(b > 0, lambda x=x: x, lambda x=x: tf.zeros(
            tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)) for x in xs]
        return {k: v[:b] for k, v in outputs(_Chain(model, xs)).items()}
  fn = tf.function(Serve, input_signature=specs, autograph=False)
  concrete = fn.get_concrete_function()
  got = [t.name.split(':')[0] for t in concrete.inputs[:len(names)]]
  assert got == names, (got, names)
  return concrete


@dataclasses.dataclass(frozen=True)
class RawImages:
  """A second signature, RAW_SIGNATURE_KEY, that takes raw images.

  Attributes:
    input_name: the signature's input name (the model's, e.g. 'image').
    example_shape: [height, width, channels] of one raw image.
    preprocess: uint8 [b, height, width, channels] -> the model's input
      (the experiment's eval preprocessing, e.g. ImageTfdsInput.
      ServingPreprocess).
  """
  input_name: str
  example_shape: Tuple[int, int, int]
  preprocess: Callable[[tf.Tensor], tf.Tensor]


def CheckedRequest(x: tf.Tensor, example_shape: Sequence[int],
                   name: str) -> tf.Tensor:
  """x, after a graph-time check of its rank and shape [b, *example_shape].

  A request of another rank or shape ends in InvalidArgumentError naming
  the expected shape, before any kernel sees it (a convolution given the
  wrong rank can abort the process under oneDNN). Give `x` a spec of
  unknown rank, or the check is decided (and folded away) when tracing.
  """
  want = [int(d) for d in example_shape]
  shape = tf.shape(x, out_type=tf.int64)
  rank_ok = tf.equal(tf.size(shape), len(want) + 1)
  padded = tf.concat([shape, tf.zeros([len(want) + 1], tf.int64)], 0)
  dims_ok = tf.reduce_all(tf.equal(padded[1:len(want) + 1], want))
  check = tf.debugging.Assert(
      tf.logical_and(rank_ok, dims_ok),
      [f'request {name} must have shape [batch, {", ".join(map(str, want))}]'
       f' ({x.dtype.name}); got shape', shape], summarize=8)
  with tf.control_dependencies([check]):
    x = tf.identity(x)
  return tf.reshape(x, [-1] + want)


def _RawFunction(default: tf.types.experimental.ConcreteFunction,
                 raw: RawImages) -> tf.types.experimental.ConcreteFunction:
  """RAW_SIGNATURE_KEY's function: check, preprocess, serving_default."""

  def ServeRaw(images):
    x = CheckedRequest(images, raw.example_shape, raw.input_name)
    return default(**{raw.input_name: raw.preprocess(x)})
  return tf.function(ServeRaw, autograph=False).get_concrete_function(
      tf.TensorSpec(None, tf.uint8, name=raw.input_name))


def ExportModel(model: base_layer.BaseLayer, export_dir: str,
                input_specs: Dict[str, tf.TensorSpec],
                pipelined: bool = False, device: Optional[str] = None,
                serving_batch_size: Optional[int] = None,
                outputs: OutputsFn = ClassifierOutputs,
                overwrite: bool = False,
                info: Optional[Dict[str, Any]] = None,
                extra_files: Optional[Dict[str, str]] = None,
                raw: Optional[RawImages] = None) -> str:
  """Writes `model` as a SavedModel with a `serving_default` signature.

  With `raw`, a second signature RAW_SIGNATURE_KEY takes uint8 images of
  any rank (checked in the graph) and applies `raw.preprocess` first.

  The SavedModel is written to a temporary folder next to export_dir and
  moved into place when complete, so export_dir never holds half an export.

  Args:
    model: the built model holding the trained weights.
    export_dir: the folder to write; must be new or empty unless overwrite.
    input_specs, pipelined, device, serving_batch_size, outputs: as in
      ServingFunction.
    overwrite: replace what export_dir holds.
    info: more JSON-serialisable facts for assets.extra/ (e.g. the run).
    extra_files: {relative path: text} also written (e.g. params.txt).
    raw: the raw-image signature to add, if any.

  Returns:
    export_dir.

  Raises:
    ExportError: see CheckExportDir and ServingFunction.
  """
  CheckExportDir(export_dir, overwrite)
  if not pipelined and device is None:
    device = DefaultServingDevice()
  concrete = ServingFunction(model, input_specs, pipelined, device,
                             serving_batch_size, outputs)
  root = tf.Module()
  # The variables the signature reads; tracking them is what saves them.
  root.model_variables = list(model.variables)
  parent = os.path.dirname(os.path.abspath(export_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f'.{os.path.basename(export_dir)}.tmp'
                     f'{os.getpid()}')
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    signatures = {SIGNATURE_KEY: concrete}
    if raw is not None:
      signatures[RAW_SIGNATURE_KEY] = _RawFunction(concrete, raw)
    tf.saved_model.save(root, tmp, signatures=signatures)
    facts = dict(
        signature=SIGNATURE_KEY,
        inputs={n: dict(shape=s.shape.as_list(), dtype=s.dtype.name)
                for n, s in input_specs.items()},
        outputs=sorted(concrete.structured_outputs),
        signatures=sorted(signatures),
        raw_inputs=({raw.input_name: dict(
            shape=[None] + list(raw.example_shape), dtype='uint8')}
                    if raw is not None else None),
        mode='pipelined' if pipelined else 'one_device',
        devices=list(model.devices) if pipelined else [device],
        serving_batch_size=serving_batch_size if pipelined else None,
        time=time.strftime('%Y-%m-%d %H:%M:%S'))
    facts.update(info or {})
    files = dict(extra_files or {})
    files[INFO_FILE] = json.dumps(facts, indent=2, sort_keys=True) + '\n'
    for rel, text in files.items():
      path = os.path.join(tmp, rel)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w') as f:
        f.write(text)
    if os.path.isdir(export_dir):
      shutil.rmtree(export_dir)
    os.replace(tmp, export_dir)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return export_dir
