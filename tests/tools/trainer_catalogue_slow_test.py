"""Catalogue of bad inputs and faults run through the trainer binary (slow).

Each case is a row of the reliability probe (../shared/notes/
reliability-probe.md: T* flags and overrides, H1 hang, D* damaged data, C*
damaged checkpoints, W* unwritable logdirs, M* another model's logdir, K1
killed saves) run as `python -m tools.trainer ...` in a subprocess, and
asserts one of two outcomes:

  clear error   the exit code, and exactly one `trainer: error: ...` line on
                stderr that names the value and the fix; no 'Traceback'.
  correct       exit code 0 (no traceback) and the case's own check of what
                the run did (which checkpoint it resumed from, which files it
                kept or removed, what it printed).

The library-side catalogue is tests/reliability_catalogue_test.py. The
summary table printed at the end gives each case's outcome and time.
"""

import dataclasses
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tests.tools import tool_testlib

_REPO = tool_testlib.ROOT
_C16 = 'consistency.Consistency16'
_FMNIST = 'image.fashion_mnist.ResNet4x8'
_TIMEOUT_S = 600
_FIX_DATA = (r'delete .*fashion_mnist and prepare it again: `bash '
             r'tools/prepare_data.sh --force`')


@dataclasses.dataclass
class _Case:
  """One catalogue row.

  Attributes:
    id: the probe's row id.
    what: the bad input or fault.
    args: trainer flags (without --model / --logdir unless given here).
    rc: the expected exit code.
    error: regex the single 'trainer: error:' line must match (clear
      error), or None (correct behaviour).
    check: (case dir, logdir, stderr) -> None, asserts what the run did.
    setup: (case dir, logdir) -> None, prepares files before the run.
    model: --model (None: give it in args).
    logdir: the --logdir, relative to the case dir (None: give it in args).
    env: extra environment variables (the case dir is '{dir}').
    file_size_limit: RLIMIT_FSIZE in bytes for the run (a full disk).
  """
  id: str
  what: str
  args: List[str]
  rc: int
  error: Optional[str] = None
  check: Optional[Callable[[str, str, str], None]] = None
  setup: Optional[Callable[[str, str], None]] = None
  model: Optional[str] = _C16
  logdir: Optional[str] = 'logdir'
  env: Dict[str, str] = dataclasses.field(default_factory=dict)
  file_size_limit: Optional[int] = None


def _Override(*items):
  return '--model_params_override=' + '; '.join(items)


# -- setups and checks ------------------------------------------------------

_TRAINED = {}  # filled by setUpClass: {'logdir': a Consistency16 run to 10}


def _CopyTrained(unused_dir, logdir):
  shutil.copytree(_TRAINED['logdir'], logdir)


def _Damage(name, how):
  """A setup: a copy of the trained logdir with checkpoints/<name> damaged."""

  def Setup(case_dir, logdir):
    _CopyTrained(case_dir, logdir)
    path = os.path.join(logdir, 'checkpoints', name)
    if how == 'truncate':
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)
    elif how == 'flip':
      with open(path, 'r+b') as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(32)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(b ^ 0xff for b in data))
    elif how == 'delete':
      os.remove(path)
    elif how == 'empty':
      open(path, 'w').close()
    else:
      with open(path, 'w') as f:
        f.write(how)
  return Setup


def _DeleteAllIndexes(case_dir, logdir):
  _CopyTrained(case_dir, logdir)
  ckpt_dir = os.path.join(logdir, 'checkpoints')
  for name in os.listdir(ckpt_dir):
    if name.endswith('.index'):
      os.remove(os.path.join(ckpt_dir, name))


def _Restored(step):
  def Check(unused_dir, unused_logdir, log):
    if not re.search(rf'restored .*ckpt-{step} at step {step}\b', log):
      raise AssertionError(f'did not restore ckpt-{step}')
  return Check


def _All(*checks):
  def Check(case_dir, logdir, log):
    for c in checks:
      c(case_dir, logdir, log)
  return Check


def _LogHas(pattern):
  def Check(unused_dir, unused_logdir, log):
    if not re.search(pattern, log, re.M):
      raise AssertionError(f'stderr lacks {pattern!r}')
  return Check


def _LatestIs(step):
  def Check(unused_dir, logdir, unused_log):
    latest = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
    if not latest or not latest.endswith(f'ckpt-{step}'):
      raise AssertionError(f'latest checkpoint {latest}, want ckpt-{step}')
  return Check


def _NoCheckpoint(unused_dir, logdir, unused_log):
  ckpt_dir = os.path.join(logdir, 'checkpoints')
  if os.path.isdir(ckpt_dir) and tf.train.latest_checkpoint(ckpt_dir):
    raise AssertionError('a checkpoint was saved')


def _ParamsUnchanged(unused_dir, logdir, unused_log):
  with open(os.path.join(logdir, 'params.txt')) as f:
    got = f.read()
  with open(os.path.join(_TRAINED['logdir'], 'params.txt')) as f:
    if got != f.read():
      raise AssertionError('params.txt was rewritten')


def _NotCreated(unused_dir, logdir, unused_log):
  if os.path.exists(logdir):
    raise AssertionError(f'{logdir} was created')


def _TempDir(case_dir, logdir):
  _CopyTrained(case_dir, logdir)
  os.makedirs(os.path.join(logdir, 'checkpoints', 'ckpt-11_temp'))
  with open(os.path.join(logdir, 'checkpoints', 'ckpt-11_temp',
                         'part-00000-of-00001.index'), 'w') as f:
    f.write('partial')


def _TempDirGone(unused_dir, logdir, unused_log):
  if os.path.exists(os.path.join(logdir, 'checkpoints', 'ckpt-11_temp')):
    raise AssertionError('ckpt-11_temp is still there')


def _BlockEvalOutputs(case_dir, logdir):
  # A logdir the evaluation cannot write to, also for root: a file where the
  # summary folder goes and a folder where eval_metrics.json goes.
  _CopyTrained(case_dir, logdir)
  with open(os.path.join(logdir, 'eval'), 'w') as f:
    f.write('not a folder')
  os.makedirs(os.path.join(logdir, 'eval_metrics.json'))


def _FileWhereLogdirGoes(case_dir, unused_logdir):
  with open(os.path.join(case_dir, 'a_file'), 'w') as f:
    f.write('x')


def _HistoryKept(unused_dir, logdir, log):
  with open(os.path.join(logdir, 'params.10.txt')) as f:
    old = f.read()
  with open(os.path.join(_TRAINED['logdir'], 'params.txt')) as f:
    if old != f.read():
      raise AssertionError('params.10.txt is not the old params.txt')
  if 'task.train.lr_schedule.value: 0.05 -> 0.07' not in log:
    raise AssertionError('the changed learning rate is not in the log')


# -- Fashion-MNIST copies with one damaged file ---------------------------

def _PreparedFashionMnist():
  from tensorpipe.inputs import tfds_utils  # pylint: disable=g-import-not-at-top
  data_dir = tfds_utils.DefaultDataDir()
  if not tfds_utils.IsPrepared('fashion_mnist', data_dir):
    raise AssertionError(
        f'Fashion-MNIST is not prepared in {data_dir}: the D* cases need it; '
        'run `bash tools/prepare_data.sh`')
  versions = sorted(os.listdir(os.path.join(data_dir, 'fashion_mnist')))
  return os.path.join(data_dir, 'fashion_mnist', versions[-1])


def _RecordBoundary(path, n):
  """Byte offset of the end of record n of a TFRecord file."""
  offset = 0
  with open(path, 'rb') as f:
    for _ in range(n):
      f.seek(offset)
      (length,) = struct.unpack('<Q', f.read(8))
      offset += 8 + 4 + length + 4
  return offset


def _DamagedData(name, how):
  """A setup: {dir}/tfds holds fashion_mnist with one file damaged."""

  def Setup(case_dir, unused_logdir):
    src = _PreparedFashionMnist()
    dst = os.path.join(case_dir, 'tfds', 'fashion_mnist',
                       os.path.basename(src))
    os.makedirs(dst)
    for f in os.listdir(src):
      if f == name:
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
      else:
        os.symlink(os.path.join(src, f), os.path.join(dst, f))
    path = os.path.join(dst, name)
    if how == 'flip':
      with open(path, 'r+b') as f:
        f.seek(1000)
        data = f.read(64)
        f.seek(1000)
        f.write(bytes(b ^ 0xff for b in data))
    elif how == 'truncate':
      with open(path, 'r+b') as f:  # inside record 4001, which the
        f.truncate(_RecordBoundary(path, 4000) + 7)  # first batch needs
    elif how == 'boundary':
      with open(path, 'r+b') as f:
        f.truncate(_RecordBoundary(path, 4000))
    elif how == 'delete':
      os.remove(path)
    else:
      os.remove(path)
      with open(path, 'w') as f:
        f.write(how)
  return Setup


_DATA_ENV = {'TENSORPIPE_DATA_DIR': '{dir}/tfds'}

# -- the catalogue ----------------------------------------------------------

_CASES = [
    _Case('T01', 'unregistered experiment', [], 2, model=_C16[:-1] + '7',
          error=r'no experiment registered .*Did you mean'),
    _Case('T03', '--max_steps=-5', ['--max_steps=-5'], 2,
          error=r'task.train.max_steps=-5 must be an int >= 0'),
    _Case('T04', 'misspelled override key',
          [_Override('task.train.max_step=3')], 2,
          error=r"max_step.*Did you mean 'max_steps'"),
    _Case('T04b', 'override value not a Python literal',
          [_Override('task.train.max_steps=ten')], 2,
          error=r"max_steps.*'ten'.*quote strings"),
    _Case('T05a', 'num_micro_batches=3 does not divide the batch of 16',
          [_Override('task.model.num_micro_batches=3')], 2,
          error=r'batch size 16 is not divisible by num_micro_batches=3; '
          r'use a batch size that is a multiple of 3'),
    _Case('T05b', 'input.batch_size=20 with T=8',
          [_Override('input.batch_size=20')], 2,
          error=r'input.batch_size=20 does not fit the pipeline task.model: '
          r'batch size 20 is not divisible by num_micro_batches=8'),
    _Case('T05c', 'num_micro_batches=0',
          [_Override('task.model.num_micro_batches=0')], 2,
          error=r'num_micro_batches=0'),
    _Case('T10', 'micro_batch_size=4 while the experiment sets T=8',
          [_Override('task.model.micro_batch_size=4')], 2,
          error=r'micro_batch_size=4.*num_micro_batches'),
    _Case('T11', '--num_cpu_devices=0', ['--num_cpu_devices=0'], 2,
          error=r'--num_cpu_devices=0 must be >= 1'),
    _Case('T12', '--num_cpu_devices=2 for K=4', ['--num_cpu_devices=2'], 2,
          error=r'num_cpu_devices'),
    _Case('T13a', '--eval_steps=0', ['--eval_steps=0'], 2,
          error=r'--eval_steps=0 must be >= 1'),
    _Case('T13b', '--eval_steps=-1', ['--eval_steps=-1'], 2,
          error=r'--eval_steps=-1 must be >= 1'),
    _Case('T14', 'task.train.grad_norm_clip=-0.01',
          [_Override('task.train.grad_norm_clip=-0.01')], 2,
          error=r'grad_norm_clip=-0.01 must be a finite number > 0 .*or 0 / '
          r'None for no clipping'),
    _Case('T15', 'task.train.max_checkpoints_to_keep=0',
          [_Override('task.train.max_checkpoints_to_keep=0')], 2,
          error=r'max_checkpoints_to_keep=0 must be an int >= 1 \(or None'),
    _Case('T25', 'optimizer swapped to Adam by its cls only',
          [_Override('task.train.optimizer.cls='
                     'type/tensorpipe.optimizers.Adam')], 2,
          error=r'beta1|momentum|Adam'),
    _Case('T26', "task.input_key='img'", [_Override("task.input_key='img'")],
          2, error=r"task.input_key='img' is not a key of the input batches; "
          r"they have \['image', 'label'\]"),
    _Case('H1', 'eval on the repeating train split, eval_steps None',
          [_Override("eval_input.split='train'",
                     'task.train.eval_steps=None')], 2,
          error=r'the eval input repeats forever .* set --eval_steps=N'),
    _Case('T24', '--mode=eval on a logdir without checkpoints (a typo)',
          ['--mode=eval'], 2, check=_NotCreated,
          error=r'NoCheckpointError: no checkpoint in .*logdir/checkpoints: '
          r'nothing to evaluate'),
    _Case('T19', '--max_steps=0 on a fresh logdir: evaluates the initial '
          'weights, as asked', ['--max_steps=0', '--eval_steps=2'], 0,
          check=_LogHas(r'^final eval: ')),
    _Case('T18a', 'lr 1e39 (inf in float32), a checkpoint every step',
          ['--mode=train', '--max_steps=3',
           _Override('task.train.lr_schedule.value=1e39',
                     'task.train.save_interval_steps=1')], 1,
          check=_NoCheckpoint,
          error=r'NonFiniteError: training stopped at step 1: the update made '
          r'weights or optimizer slots non-finite .*no checkpoint was saved; '
          r'lower the learning rate'),
    _Case('T18b', 'resume with lr 1e39: the finite checkpoint stays latest',
          ['--mode=train', '--max_steps=12',
           _Override('task.train.lr_schedule.value=1e39',
                     'task.train.save_interval_steps=1')], 1,
          setup=_CopyTrained, check=_LatestIs(10),
          error=r'step 11: .*the newest checkpoint, ckpt-10, is finite and '
          r'stays the latest'),
    _Case('W1a', '--logdir under a regular file', ['--logdir={dir}/a_file/x'],
          2, setup=_FileWhereLogdirGoes, logdir=None,
          error=r'NotADirectoryError: .*a_file'),
    _Case('W1b', '--logdir=/proc/nonexistent/x', ['--logdir=/proc/none/x'], 2,
          logdir=None, error=r'FileNotFoundError: .*/proc/none'),
    _Case('W4', '--mode=eval of a finished run whose logdir cannot be '
          'written: still reports', ['--mode=eval', '--eval_steps=2'], 0,
          setup=_BlockEvalOutputs,
          check=_All(_LogHas(r'could not write the eval results'),
                     _LogHas(r'^final eval: '))),
    _Case('W5', 'disk full during a checkpoint write (file size limit)',
          ['--mode=train', '--max_steps=12'], 1, setup=_CopyTrained,
          file_size_limit=100_000, check=_LatestIs(10),
          error=r'CheckpointWriteError: could not write the checkpoint of '
          r'step 12 in .*: .*; the last checkpoint, ckpt-10, is intact\. Free '
          r'space'),
    _Case('C1', 'newest checkpoint data file truncated',
          ['--mode=train', '--max_steps=12'], 0,
          setup=_Damage('ckpt-10.data-00000-of-00001', 'truncate'),
          check=_All(_LogHas(r'skipping checkpoint .*ckpt-10: reading its '
                             r'data file .*ckpt-10.data-00000-of-00001'),
                     _Restored(8), _LatestIs(12))),
    _Case('C2', 'newest checkpoint index bytes flipped',
          ['--mode=eval', '--eval_steps=2'], 0,
          setup=_Damage('ckpt-10.index', 'flip'),
          check=_All(_LogHas(r'skipping checkpoint .*ckpt-10: its index '
                             r'file .*ckpt-10.index is damaged'),
                     _Restored(8))),
    _Case('C3', 'newest checkpoint index deleted',
          ['--mode=eval', '--eval_steps=2'], 0,
          setup=_Damage('ckpt-10.index', 'delete'),
          check=_All(_LogHas(r'index file .*ckpt-10.index is missing'),
                     _Restored(8))),
    _Case('C4', 'garbage checkpoint state file (was: silent restart at 0)',
          ['--mode=train', '--max_steps=12'], 0,
          setup=_Damage('checkpoint', 'garbage {{{'),
          check=_All(_LogHas(r'checkpoint state file .*checkpoint is '
                             r'damaged'), _Restored(10), _LatestIs(12))),
    _Case('C5', 'empty checkpoint state file',
          ['--mode=eval', '--eval_steps=2'], 0,
          setup=_Damage('checkpoint', 'empty'),
          check=_All(_LogHas(r'state file .*checkpoint is damaged'),
                     _Restored(10))),
    _Case('C6', 'every checkpoint index deleted', ['--mode=train'], 2,
          setup=_DeleteAllIndexes, check=_ParamsUnchanged,
          error=r'CheckpointError: no usable checkpoint in .*checkpoints: '
          r'ckpt-10: .*ckpt-10.index is missing;.* Move the damaged files '
          r'away'),
    _Case('K1', 'a killed save left ckpt-11_temp/',
          ['--mode=train', '--max_steps=12'], 0, setup=_TempDir,
          check=_All(_TempDirGone, _LogHas(r'removed 1 leftovers'),
                     _LatestIs(12))),
    _Case('M1a', 'resume with num_classes changed',
          ['--mode=train', '--max_steps=12',
           _Override('task.num_classes=5',
                     'task.model.layers[17].output_dim=5')], 2,
          setup=_CopyTrained, check=_ParamsUnchanged,
          error=r'IncompatibleCheckpointError: .*checkpoints holds a run of '
          r'\S+ whose params.txt differs from these Params in '
          r'task.model.layers\[17\].output_dim, task.num_classes; its '
          r'variables differ from this model.s: model/model/logits/b: shape '
          r'\[5\] here, \[4\] in the checkpoint'),
    _Case('M1b', 'resume with a renamed layer',
          ['--mode=train', '--max_steps=12',
           _Override("task.model.layers[3].name='conv3b'")], 2,
          setup=_CopyTrained, check=_ParamsUnchanged,
          error=r'its variables differ from this model.s: '
          r'model/model/conv3b/w \(not in the checkpoint\), '
          r'model/model/conv3/w \(only in the checkpoint\)'),
    _Case('M1c', 'resume a Consistency16 logdir with ResNet4x8',
          ['--mode=train', '--max_steps=12'], 2, model=_FMNIST,
          setup=_CopyTrained, check=_ParamsUnchanged,
          error=r'holds a run of \S+ whose params.txt differs .*its '
          r'variables differ from this model.s: '),
    _Case('M6', 'resume with a changed learning rate: diff logged, old '
          'params.txt kept as params.10.txt',
          ['--mode=train', '--max_steps=12',
           _Override('task.train.lr_schedule.value=0.07')], 0,
          setup=_CopyTrained, check=_All(_HistoryKept, _LatestIs(12))),
    _Case('D3', 'Fashion-MNIST train tfrecord with flipped bytes',
          ['--mode=train', '--max_steps=2'], 1, model=_FMNIST, env=_DATA_ENV,
          setup=_DamagedData('fashion_mnist-train.tfrecord-00000-of-00001',
                             'flip'),
          error=r'DataFileError: .*fashion_mnist-train.tfrecord-00000-of-00001'
          r' is damaged \(.*\) \(split .train. of .fashion_mnist.\); '
          + _FIX_DATA),
    _Case('D4a', 'train tfrecord truncated mid-record',
          ['--mode=train', '--max_steps=2'], 1, model=_FMNIST, env=_DATA_ENV,
          setup=_DamagedData('fashion_mnist-train.tfrecord-00000-of-00001',
                             'truncate'),
          error=r'DataFileError: .*fashion_mnist-train.tfrecord-00000-of-00001'
          r' (is damaged \(.*truncated.*\)|holds 4000 of its 60000 records '
          r'\(truncated\)).*; ' + _FIX_DATA),
    _Case('D4b', 'train tfrecord cut at a record boundary (4000 of 60000)',
          ['--mode=train', '--max_steps=2'], 1, model=_FMNIST, env=_DATA_ENV,
          setup=_DamagedData('fashion_mnist-train.tfrecord-00000-of-00001',
                             'boundary'),
          error=r'DataFileError: .*fashion_mnist-train.tfrecord-00000-of-00001'
          r' holds 4000 of its 60000 records \(truncated\).*; ' + _FIX_DATA),
    _Case('D5', 'train tfrecord deleted (dataset_info.json kept)',
          ['--mode=train', '--max_steps=2'], 2, model=_FMNIST, env=_DATA_ENV,
          setup=_DamagedData('fashion_mnist-train.tfrecord-00000-of-00001',
                             'delete'),
          error=r'CorruptDataError: .*fashion_mnist-train.tfrecord-00000-of-'
          r"00001 is missing \(split 'train' of 'fashion_mnist'\); "
          + _FIX_DATA),
    _Case('D6', 'dataset_info.json is "{not json"',
          ['--mode=train', '--max_steps=2'], 2, model=_FMNIST, env=_DATA_ENV,
          setup=_DamagedData('dataset_info.json', '{not json'),
          error=r'CorruptDataError: .*dataset_info.json is damaged '
          r'\(JSONDecodeError: .*\); ' + _FIX_DATA),
]


class TrainerCatalogueTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='trainer_catalogue_',
                               dir=os.environ.get('TEST_TMPDIR'))
    cls.results = []
    logdir = os.path.join(cls.tmp, 'trained10')
    # Checkpoints 2, 4, 6, 8, 10.
    out = cls._Trainer([
        f'--model={_C16}', f'--logdir={logdir}', '--mode=train',
        '--max_steps=10', _Override('task.train.save_interval_steps=2',
                                    'task.train.max_checkpoints_to_keep=5')])
    if out.returncode != 0:
      raise AssertionError(f'the base run failed:\n{out.stderr[-3000:]}')
    _TRAINED['logdir'] = logdir

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    counts = {}
    print('\ncase  outcome        rc  seconds  what')
    for case, outcome, seconds, line in cls.results:
      counts[outcome] = counts.get(outcome, 0) + 1
      print(f'{case.id:5s} {outcome:13s} {case.rc:3d} {seconds:7.1f}  '
            f'{case.what}')
      if line:
        print(f'      {line[:240]}')
    print('trainer catalogue: ' + ', '.join(f'{n} {k}' for k, n in
                                           sorted(counts.items())))
    super().tearDownClass()

  @staticmethod
  def _Trainer(args, env=None, file_size_limit=None):
    full_env = dict(os.environ)
    full_env['PYTHONPATH'] = os.pathsep.join(
        p for p in (_REPO, full_env.get('PYTHONPATH')) if p)
    full_env.update(env or {})

    def Limit():
      if file_size_limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (file_size_limit, file_size_limit))
    proc = subprocess.Popen(
        [sys.executable, '-m', 'tools.trainer', *args], cwd=_REPO,
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=Limit)
    try:
      stdout, stderr = proc.communicate(timeout=_TIMEOUT_S)
    finally:
      if proc.poll() is None:
        proc.kill()  # by its PID
        proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                       stderr)

  def testCatalogue(self):
    self.assertGreaterEqual(len(_CASES), 20)
    self.assertEqual(len({c.id for c in _CASES}), len(_CASES))
    for case in _CASES:
      with self.subTest(case=case.id):
        self._RunCase(case)

  def _RunCase(self, case):
    case_dir = tempfile.mkdtemp(prefix=case.id + '_', dir=self.tmp)
    logdir = os.path.join(case_dir, case.logdir) if case.logdir else None
    if case.setup:
      case.setup(case_dir, logdir)
    args = [a.replace('{dir}', case_dir) for a in case.args]
    if case.model:
      args.insert(0, f'--model={case.model}')
    if logdir:
      args.insert(1, f'--logdir={logdir}')
    env = {k: v.replace('{dir}', case_dir) for k, v in case.env.items()}
    start = time.time()
    out = self._Trainer(args, env, case.file_size_limit)
    seconds = time.time() - start
    log = out.stderr + out.stdout
    context = f'{case.id} {case.what}: rc {out.returncode}\n{log[-4000:]}'
    self.assertEqual(out.returncode, case.rc, context)
    self.assertNotIn('Traceback', log, context)
    errors = [line for line in out.stderr.splitlines()
              if line.startswith('trainer: error:')]
    if case.error is None:
      self.assertEqual(errors, [], context)
      outcome = 'correct'
    else:
      self.assertEqual(len(errors), 1, context)
      self.assertRegex(errors[0], case.error, context)
      outcome = 'clear error'
    if case.check:
      case.check(case_dir, logdir or '', log)
    self.results.append((case, outcome, seconds,
                         errors[0] if errors else ''))
    shutil.rmtree(case_dir, ignore_errors=True)


if __name__ == '__main__':
  unittest.main()
