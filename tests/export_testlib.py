"""Runs an exported SavedModel in a fresh process that cannot import tensorpipe.

Shared by tests/export_test.py and tests/tools/export_slow_test.py. The
process runs this venv's interpreter with `-S` (no site hook, so neither
.pth files nor the clone's editable install) and PYTHONPATH = the venv's
site-packages only; its working directory is a new empty folder. It asserts
that tensorpipe cannot be imported and that the repository is not on its
path, loads the SavedModel with plain `tf.saved_model.load` and runs the
`serving_default` signature (or another) on each input batch.
"""

import json
import os
import site
import subprocess
import sys
import tempfile
import textwrap
from typing import Dict, List, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300

_SCRIPT = textwrap.dedent("""
    import importlib.util, json, os, sys
    import numpy as np
    repo, export_dir, inputs, out, key = sys.argv[1:6]
    assert importlib.util.find_spec('tensorpipe') is None, (
        'tensorpipe is importable: ' + str(sys.path))
    real = [os.path.realpath(p or '.') for p in sys.path]
    assert os.path.realpath(repo) not in real, sys.path
    import tensorflow as tf
    serve = tf.saved_model.load(export_dir).signatures[key]
    _, kwargs = serve.structured_input_signature
    result, errors = {}, {}
    with np.load(inputs) as data:
      names = sorted({k.split('/', 1)[1] for k in data.files})
      batches = sorted({int(k.split('/', 1)[0]) for k in data.files})
      for i in batches:
        try:
          got = serve(**{n: tf.constant(data[f'{i}/{n}']) for n in names})
        except tf.errors.InvalidArgumentError as e:
          errors[i] = e.message.strip()[:4000]
          continue
        for name, value in got.items():
          result[f'{i}/{name}'] = value.numpy()
    np.savez(out, **result)
    print(json.dumps(dict(
        inputs={k: [s.shape.as_list() if s.shape.rank is not None else None,
                    s.dtype.name] for k, s in kwargs.items()},
        errors=errors,
        outputs=sorted(serve.structured_outputs),
        modules=sorted(m for m in sys.modules if m.startswith('tensorpipe')),
        devices=[d.name for d in tf.config.list_logical_devices()])))
    """)


def _Env(tmp: str) -> Dict[str, str]:
  packages = [p for p in site.getsitepackages() if os.path.isdir(p)]
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('PYTHON', 'RUNFILES', 'BUILD_'))}
  env.update(PYTHONPATH=os.pathsep.join(packages), HOME=tmp,
             TF_CPP_MIN_LOG_LEVEL='2')
  return env


class LoadResult:
  """What the clean process saw: outputs per batch and the signature."""

  def __init__(self, outputs: List[Dict[str, np.ndarray]], info: Dict):
    self.outputs = outputs          # per input batch: {output name: array}
    self.inputs = info['inputs']    # {name: [shape, dtype]}
    self.output_names = info['outputs']
    self.modules = info['modules']  # tensorpipe modules loaded (none)
    self.devices = info['devices']
    # {batch index: its InvalidArgumentError's message}.
    self.errors = {int(i): m for i, m in info['errors'].items()}


def RunInCleanProcess(export_dir: str,
                      batches: Sequence[Dict[str, np.ndarray]],
                      tmp_dir: str,
                      signature: str = 'serving_default') -> LoadResult:
  """Loads export_dir in a fresh process without tensorpipe; runs batches.

  Args:
    export_dir: the SavedModel.
    batches: per call, {input name: array}.
    tmp_dir: a folder for the exchange files.
    signature: the signature key to call. A call that raises
      InvalidArgumentError is recorded in `errors` and the process goes on.

  Raises:
    AssertionError: the process failed (its stderr's end in the message).
  """
  export_dir = os.path.abspath(export_dir)
  work = tempfile.mkdtemp(prefix='clean_load_', dir=tmp_dir)
  inputs = os.path.join(work, 'inputs.npz')
  out = os.path.join(work, 'outputs.npz')
  np.savez(inputs, **{f'{i}/{name}': value for i, batch in enumerate(batches)
                      for name, value in batch.items()})
  proc = subprocess.run(
      [sys.executable, '-S', '-c', _SCRIPT, REPO, export_dir, inputs, out,
       signature],
      cwd=work, env=_Env(work), capture_output=True, text=True,
      timeout=TIMEOUT_S, check=False)
  if proc.returncode:
    raise AssertionError(f'loading {export_dir} in a clean process failed '
                         f'(exit {proc.returncode}):\n{proc.stderr[-4000:]}')
  info = json.loads(proc.stdout.strip().splitlines()[-1])
  outputs = [{} for _ in batches]
  with np.load(out) as data:
    for key in data.files:
      i, name = key.split('/', 1)
      outputs[int(i)][name] = data[key]
  return LoadResult(outputs, info)
