"""The installable package (pyproject.toml): a wheel that works on its own.

Builds the wheel from a copy of pyproject.toml, tensorpipe/ and models/ (the
source tree stays untouched, read-only under Bazel), installs it into a
temporary folder with `pip install --target` and imports it in a fresh
process whose working directory is another temporary folder and whose path
holds neither the repository nor its editable install. Also: the wheel holds
exactly the library and the zoo, under `tensorpipe` only; the dependency
ranges admit the pins of requirements.txt; and after tools/setup.sh the
clone's venv imports the clone from any directory (the README's snippet).

Every pip and Python subprocess runs offline (--no-index, no build
isolation) under a timeout.
"""

import email.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile

from packaging import requirements as pkg_requirements

# The repository root (under Bazel: the runfiles tree's copy of it).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PIP_TIMEOUT_S = 300
_RUN_TIMEOUT_S = 300
# The installed wheel's folders: the library and the zoo mapped under it.
_SOURCES = {'tensorpipe': 'tensorpipe', 'models': 'tensorpipe/models'}


def _CleanEnv(tmp, pythonpath=None):
  """The environment of a subprocess: no PYTHONPATH (Bazel sets one to the
  runfiles), pip quiet and offline, HOME writable."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('PYTHON', 'PIP_', 'BUILD_', 'RUNFILES'))}
  env.update(HOME=tmp, PIP_DISABLE_PIP_VERSION_CHECK='1',
             PIP_NO_CACHE_DIR='1', PIP_NO_INPUT='1',
             TF_CPP_MIN_LOG_LEVEL='2')
  if pythonpath:
    env['PYTHONPATH'] = pythonpath
  return env


def _Run(cmd, cwd, env, timeout=_PIP_TIMEOUT_S):
  out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout, check=False)
  if out.returncode:
    raise AssertionError(f'{" ".join(cmd)} exited {out.returncode}:\n'
                         f'{out.stdout[-3000:]}\n{out.stderr[-3000:]}')
  return out


def _RepoPyFiles():
  """{path in the wheel: path in the repo} of every .py file to install."""
  out = {}
  for folder, target in _SOURCES.items():
    base = os.path.join(_ROOT, folder)
    for dirpath, dirnames, filenames in os.walk(base):
      dirnames[:] = [d for d in dirnames if d != '__pycache__']
      for name in filenames:
        if name.endswith('.py'):
          rel = os.path.relpath(os.path.join(dirpath, name), base)
          out[f'{target}/{rel}'.replace(os.sep, '/')] = os.path.join(
              dirpath, name)
  return out


class WheelTest(unittest.TestCase):
  """One wheel built in setUpClass; each test checks one property of it."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='packaging_test_',
                               dir=os.environ.get('TEST_TMPDIR'))
    src = os.path.join(cls.tmp, 'src')
    os.makedirs(src)
    shutil.copy(os.path.join(_ROOT, 'pyproject.toml'), src)
    for folder in _SOURCES:  # .py files only: no BUILD files, no caches
      shutil.copytree(os.path.join(_ROOT, folder), os.path.join(src, folder),
                      ignore=lambda d, names: [
                          n for n in names if not n.endswith('.py') and
                          not os.path.isdir(os.path.join(d, n)) or
                          n == '__pycache__'])
    cls.env = _CleanEnv(cls.tmp)
    dist = os.path.join(cls.tmp, 'dist')
    _Run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-index',
          '--no-build-isolation', '-q', '-w', dist, src], cls.tmp, cls.env)
    wheels = [f for f in os.listdir(dist) if f.endswith('.whl')]
    assert len(wheels) == 1, wheels
    cls.wheel = os.path.join(dist, wheels[0])
    with zipfile.ZipFile(cls.wheel) as z:
      cls.names = z.namelist()
      info = [n for n in cls.names if n.endswith('.dist-info/METADATA')]
      cls.metadata = email.parser.Parser().parsestr(
          z.read(info[0]).decode('utf-8'))
      top = [n for n in cls.names if n.endswith('.dist-info/top_level.txt')]
      cls.top_level = (z.read(top[0]).decode('utf-8').split()
                       if top else None)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def testWheelInstallsOnlyTheTensorpipePackage(self):
    tops = {n.split('/', 1)[0] for n in self.names}
    dist_info = {t for t in tops if t.endswith('.dist-info')}
    self.assertEqual(tops - dist_info, {'tensorpipe'})
    if self.top_level is not None:
      self.assertEqual(self.top_level, ['tensorpipe'])

  def testWheelHoldsEveryModuleOfTheLibraryAndTheZoo(self):
    # A new package folder below tensorpipe/ must be listed in pyproject.toml.
    expected = set(_RepoPyFiles())
    self.assertIn('tensorpipe/models/resnet.py', expected)
    in_wheel = {n for n in self.names if n.endswith('.py')}
    self.assertEqual(sorted(expected - in_wheel), [],
                     'modules missing from the wheel: add their package to '
                     '[tool.setuptools] packages in pyproject.toml')
    self.assertEqual(sorted(in_wheel - expected), [])

  def testDependenciesAreRangesThatAdmitThePins(self):
    pins = {}
    with open(os.path.join(_ROOT, 'requirements.txt')) as f:
      for line in f:
        line = line.split('#', 1)[0].strip()
        if line:
          req = pkg_requirements.Requirement(line)
          pins[req.name.lower().replace('_', '-')] = next(
              iter(req.specifier)).version
    deps = [pkg_requirements.Requirement(r)
            for r in self.metadata.get_all('Requires-Dist')]
    runtime = [r for r in deps if r.marker is None]
    self.assertIn('tensorflow', {r.name for r in runtime})
    for req in deps:
      name = req.name.lower().replace('_', '-')
      self.assertTrue(str(req.specifier), f'{req} has no version range')
      self.assertFalse(any(s.operator == '==' for s in req.specifier),
                       f'{req}: exact pins belong in requirements.txt')
      self.assertIn(name, pins, f'{req} is not pinned in requirements.txt')
      self.assertIn(pins[name], req.specifier,
                    f'requirements.txt pins {name}=={pins[name]}, outside '
                    f'the range {req}')

  def testInstalledWheelImportsAndRunsAPipelineWithoutTheRepository(self):
    target = os.path.join(self.tmp, 'site')
    _Run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-index',
          '-q', '--target', target, self.wheel], self.tmp, self.env)
    cwd = tempfile.mkdtemp(dir=self.tmp, prefix='elsewhere_')
    # K=2 partitions, T=2 micro-batches, batch 4: the pipelined output must
    # equal the same layers chained without the pipeline; batch norm makes
    # the training-mode output depend on the micro-batching.
    script = textwrap.dedent("""
        import importlib.util, json, os, sys
        root = os.path.realpath(sys.argv[1])
        assert root not in [os.path.realpath(p or '.') for p in sys.path], (
            sys.path)
        import numpy as np
        import tensorflow as tf
        import tensorpipe
        from tensorpipe import layers
        from tensorpipe.layers import composite
        from tensorpipe.models import resnet
        tensorpipe.SetNumLogicalCpuDevices(2)
        stack = [layers.Conv2DLayer.Params().Set(
                     name=f'conv{i}', filter_shape=(3, 3, 1, 1))
                 for i in range(4)]
        p = tensorpipe.TensorPipeLayer.Params().Set(
            name='pipe', layers=stack, num_partitions=2, num_micro_batches=2,
            input_shapes=[[4, 6, 6, 1]])
        pipe = p.Instantiate()
        x = tf.random.stateless_uniform([4, 6, 6, 1], seed=[1, 2])
        y = pipe.FPropDefaultTheta(x)
        ref = x
        for layer, theta in pipe.LayersWithTheta():
          ref = layer.FProp(theta, ref)
        net = resnet.SmallResNetLayers(8, 1)
        print(json.dumps(dict(
            tensorpipe=tensorpipe.__file__, resnet=resnet.__file__,
            partitions=pipe.num_partitions,
            max_diff=float(np.max(np.abs(y.numpy() - ref.numpy()))),
            scale=float(np.max(np.abs(ref.numpy()))),
            zoo_layers=len(net),
            models=importlib.util.find_spec('models') is not None,
            params=importlib.util.find_spec('params') is not None)))
        """)
    out = _Run([sys.executable, '-c', script, _ROOT], cwd,
               _CleanEnv(self.tmp, pythonpath=target), _RUN_TIMEOUT_S)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    target_real = os.path.realpath(target)
    for module in ('tensorpipe', 'resnet'):
      self.assertTrue(
          os.path.realpath(result[module]).startswith(target_real + os.sep),
          f'{module} imported from {result[module]}, not from the installed '
          f'wheel in {target}')
    self.assertEqual(result['partitions'], 2)
    self.assertGreater(result['zoo_layers'], 0)
    # Convolutions with or without a pipeline: the same float32 ops on the
    # same rows, so only rounding can differ.
    self.assertLessEqual(result['max_diff'], 1e-6 * max(result['scale'], 1))
    self.assertFalse(result['models'], 'a top-level `models` is importable')
    self.assertFalse(result['params'], 'a top-level `params` is importable')


class EditableInstallTest(unittest.TestCase):

  def testCloneVenvImportsTheCloneFromAnyDirectory(self):
    """What tools/setup.sh sets up: `pip install -e .` into .venv."""
    source = os.path.dirname(os.path.dirname(os.path.realpath(
        os.path.join(_ROOT, 'tensorpipe', '__init__.py'))))
    venv = os.path.join(source, '.venv')
    if os.path.realpath(sys.prefix) != os.path.realpath(venv):
      self.skipTest(f'not run by the clone\'s venv ({venv}) but by '
                    f'{sys.prefix}')
    tmp = tempfile.mkdtemp(dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, tmp, True)
    script = ('import importlib.util, json, tensorpipe; print(json.dumps(['
              'tensorpipe.__file__, importlib.util.find_spec('
              '"tensorpipe.models").origin, importlib.util.find_spec('
              '"models") is None]))')
    out = subprocess.run([sys.executable, '-c', script], cwd=tmp,
                         env=_CleanEnv(tmp), capture_output=True, text=True,
                         timeout=_RUN_TIMEOUT_S, check=False)
    self.assertEqual(out.returncode, 0,
                     f'`import tensorpipe` fails outside the clone: run '
                     f'bash tools/setup.sh (it installs the clone editable '
                     f'into .venv)\n{out.stderr[-2000:]}')
    init, zoo, no_models = json.loads(out.stdout.strip().splitlines()[-1])
    self.assertEqual(os.path.realpath(init),
                     os.path.join(source, 'tensorpipe', '__init__.py'))
    self.assertEqual(os.path.realpath(zoo),
                     os.path.join(source, 'models', '__init__.py'))
    self.assertTrue(no_models, 'a top-level `models` is importable')


if __name__ == '__main__':
  unittest.main()
