"""Trains and evaluates a registered experiment.

  bazel run //tools:trainer -- --model=image.fashion_mnist.ResNet4x8 \
      --logdir=/tmp/fmnist
  python -m tools.trainer --model=consistency.Consistency16 --logdir=/tmp/c \
      --model_params_override='task.train.max_steps=20; input.batch_size=32'

Writes logdir/params.txt (the final Params; a resume with changed Params keeps
the old file as params.<step>.txt and logs the difference; a CSV schedule
given as a path is recorded as its table, schedules.CsvParam), TensorBoard
summaries in logdir/train and logdir/eval, checkpoints in logdir/checkpoints
(resumed on restart from the newest intact one) and logdir/eval_metrics.json.
While training it holds logdir/trainer.lock: a second trainer on the same
logdir stops at once naming the holder's PID and host (--mode=eval takes no
lock and writes only eval results). Without an accelerator the pipeline's
partitions run on --num_cpu_devices logical CPU devices (default: the largest
num_partitions of the experiment's model).

SIGTERM or SIGINT (Ctrl-C) lets the current step finish, saves a checkpoint
and ends with one line "trainer: stopped by SIGTERM at step N; saved ckpt-N;
run the same command to resume" and exit code 143 (SIGTERM) or 130 (SIGINT);
every worker of a multi-worker run stops after the same step. Before the
first step, or on a second signal, it exits at once (tensorpipe/preemption.py).

Mistakes and failures end in one line `trainer: error: ...` on stderr naming
the value and the fix, without a traceback. Exit codes: 0 done; 2 the command
cannot run as given (flags, Params, inputs, a locked or unusable logdir or
checkpoint); 1 the run failed on the way (NaN / Inf loss or weights, damaged
input data, a checkpoint that could not be written). The newest checkpoint is
always finite and intact, so after fixing the cause the same command resumes.
"""

# First of all, before TensorFlow starts any thread (tools/console imports
# it): SIGTERM and SIGINT blocked in this thread, so that TF's threads
# inherit the mask and never take them; TF's preemption notifier would
# swallow SIGTERM during a cluster's registration (tensorpipe/cluster.py).
# _Main installs the handlers and unblocks them (StopSignals.Release).
import signal  # pylint: disable=g-bad-import-order
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

# Then, before anything imports TensorFlow: its C++ log lines off
# (--tf_logs).
from tools import console  # pylint: disable=g-bad-import-order,g-import-not-at-top

import atexit
import os
import sys

from absl import app
from absl import flags
from absl import logging

from tensorpipe import preemption
from tools import paths

FLAGS = flags.FLAGS
flags.DEFINE_string('model', None, 'Registered experiment key, e.g. '
                    'image.fashion_mnist.ResNet4x8 (--model=list lists them).')
flags.DEFINE_string('logdir', None, 'Directory of checkpoints, summaries and '
                    'params.txt; relative paths are taken from the directory '
                    'bazel run was called in.')
flags.DEFINE_enum('mode', 'train_and_eval', ['train', 'eval', 'train_and_eval'],
                  'What to run.')
flags.DEFINE_string('model_params_override', '', "Params overrides, 'key=value' "
                    "or 'key : value' items separated by ';' or newlines, e.g. "
                    "'task.model.num_micro_batches=16; input.batch_size=64'.")
flags.DEFINE_integer('max_steps', None, 'Overrides task.train.max_steps.')
flags.DEFINE_integer('eval_steps', None, 'Eval batches (overrides '
                     'task.train.eval_steps; default the whole eval split).')
flags.DEFINE_integer('recompute_bn_stats', 0, 'Before the final evaluation '
                     '(--mode=eval or train_and_eval), set every batch-norm '
                     "layer's moving averages from this many training "
                     'batches (Trainer.RecomputeBatchNormStats; in memory '
                     'only, checkpoints keep the trained averages). 0: off.')
flags.DEFINE_integer('num_cpu_devices', None, 'Logical CPU devices to create '
                     'when there is no accelerator; default: enough for the '
                     "model's partitions.")
flags.DEFINE_integer('num_replicas', 1, 'R: data-parallel replicas of the '
                     'pipeline in this process, each on its own group of K '
                     'devices (R x K devices in all). With a cluster '
                     '(TF_CONFIG or --worker_hosts) each worker process is '
                     'one replica instead.')
flags.DEFINE_string('worker_hosts', None, 'Multi-worker training without '
                    'TF_CONFIG: "host:port,host:port,..." of every worker, '
                    'the same on each; worker 0 is the chief.')
flags.DEFINE_integer('task_index', None, "This worker's index in "
                     '--worker_hosts.')
flags.DEFINE_float('peer_wait_s', 60.0, 'Multi-worker start: seconds to '
                   'wait for every other worker to accept connections on its '
                   'address (progress lines every 10 s), then fail naming '
                   'the missing ones.')
flags.DEFINE_integer('seed', 1234, 'Global TensorFlow / NumPy seed.')
flags.DEFINE_bool('deterministic', True, 'Enable op determinism (exact '
                  'resume and reproducible runs on CPU).')


class _UserError(Exception):
  """A mistake in the flags, overrides or setup: printed without traceback."""


def _Errors():
  """(setup errors, run errors) printed as one line instead of a traceback."""
  # pylint: disable=g-import-not-at-top
  from tensorpipe import base_input
  from tensorpipe import checkpoints
  from tensorpipe import finite_check
  from tensorpipe import hyperparams
  from tensorpipe import logdir as logdir_lib
  from tensorpipe import run_checkpoints
  setup = (ValueError, TypeError, OSError, RecursionError, RuntimeError,
           hyperparams.UnknownParamError, logdir_lib.LogdirLockedError,
           checkpoints.CheckpointError)
  import tensorflow as tf
  run = (finite_check.NonFiniteError, run_checkpoints.CheckpointWriteError,
         base_input.DataFileError, FloatingPointError,
         # What a collective raises when another worker died or hangs.
         tf.errors.UnavailableError, tf.errors.AbortedError,
         tf.errors.DeadlineExceededError, tf.errors.CancelledError)
  return setup, run


def _ParamsFromFlags():
  """The experiment's Params with the flags' overrides; checks the flags.

  Raises:
    _UserError: a missing or bad flag, override or CSV schedule file.
  """
  # pylint: disable=g-import-not-at-top
  from tensorpipe import model_registry
  from tensorpipe import overrides
  # pylint: enable=g-import-not-at-top
  if not FLAGS.model:
    raise _UserError('--model is required, e.g. --model='
                     'image.fashion_mnist.ResNet4x8; --model=list lists the '
                     'registered experiments')
  if FLAGS.model == 'list':
    print('\n'.join(model_registry.ListKeys()))
    sys.exit(0)
  if not FLAGS.logdir:
    raise _UserError('--logdir is required (where checkpoints, summaries and '
                     'params.txt go)')
  try:
    exp = model_registry.GetExperiment(FLAGS.model)
    p = exp.ModelParams()
    overrides.ApplyOverrides(p, FLAGS.model_params_override)
    if FLAGS.max_steps is not None:
      p.task.train.max_steps = FLAGS.max_steps
    if FLAGS.eval_steps is not None:
      p.task.train.eval_steps = FLAGS.eval_steps
    # A CSV schedule given as a path is recorded as its table: params.txt
    # then needs no file to export, and a changed file shows on resume.
    overrides.RecordCsvSchedules(p, paths.UserPath)
  except ValueError as e:
    raise _UserError(str(e)) from None
  if FLAGS.num_cpu_devices is not None and FLAGS.num_cpu_devices < 1:
    raise _UserError(f'--num_cpu_devices={FLAGS.num_cpu_devices} must be >= '
                     '1 (leave it unset for one device per partition)')
  if FLAGS.recompute_bn_stats < 0 or (FLAGS.recompute_bn_stats and
                                      FLAGS.mode == 'train'):
    raise _UserError(f'--recompute_bn_stats={FLAGS.recompute_bn_stats} needs '
                     '--mode=eval or train_and_eval and a count >= 0 (0: '
                     'off)')
  if FLAGS.eval_steps is not None and FLAGS.eval_steps < 1:
    raise _UserError(f'--eval_steps={FLAGS.eval_steps} must be >= 1 (leave '
                     'it unset to read the whole eval split)')
  return p


def _ClusterFromFlags():
  """The cluster of --worker_hosts / TF_CONFIG, or None; checks the flags
  that go with it."""
  from tensorpipe import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  try:
    cluster = cluster_lib.ClusterFromFlagsOrEnvironment(FLAGS.worker_hosts,
                                                        FLAGS.task_index)
  except ValueError as e:
    raise _UserError(str(e)) from None
  if FLAGS.num_replicas < 1:
    raise _UserError(f'--num_replicas={FLAGS.num_replicas} must be >= 1')
  if not FLAGS.peer_wait_s > 0:
    raise _UserError(f'--peer_wait_s={FLAGS.peer_wait_s:g} must be > 0 '
                     '(seconds to wait for the other workers at start-up)')
  return cluster


def _Setup(stop: preemption.StopSignals):
  """Flags -> (trainer, life cycle); raises _UserError for user mistakes."""
  # Nothing here may run a TensorFlow op before the devices are configured.
  # pylint: disable=g-import-not-at-top
  from tensorpipe import distribute
  from tensorpipe import run_life_cycle
  from tensorpipe import trainer_lib
  from tensorpipe import worker_agreement
  import tensorpipe
  # pylint: enable=g-import-not-at-top
  p = _ParamsFromFlags()
  cluster = _ClusterFromFlags()
  logdir = paths.UserPath(FLAGS.logdir)
  life = run_life_cycle.RunLifeCycle(
      logdir, cluster, stop, take_lock=FLAGS.mode != 'eval',
      peer_wait_s=FLAGS.peer_wait_s)
  atexit.register(life.Unlock)  # also when setup fails below
  num_partitions = distribute.MaxNumPartitions(p.task)

  def SetupDevices():
    local_replicas = 1 if cluster is not None else FLAGS.num_replicas
    tensorpipe.SetNumLogicalCpuDevices(
        FLAGS.num_cpu_devices if FLAGS.num_cpu_devices is not None
        else local_replicas * num_partitions)
    if FLAGS.deterministic:
      trainer_lib.EnableDeterminism(FLAGS.seed)

  setup_errors, _ = _Errors()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorpipe import errors  # pylint: disable=g-import-not-at-top
  try:
    topology = life.Start(p, num_partitions, FLAGS.num_replicas,
                          worker_agreement.StepFlagValues(FLAGS),
                          SetupDevices)
    if FLAGS.recompute_bn_stats and topology.num_replicas > 1:
      raise ValueError(
          f'--recompute_bn_stats runs in one process, but this run has '
          f'{topology.num_replicas} replicas: train without it, then '
          'evaluate the logdir with --mode=eval --recompute_bn_stats=N and '
          'no cluster')
    if topology.num_replicas > 1:
      logging.info('%d replicas x %d partitions; this process: replicas '
                   '%d..%d on %s%s', topology.num_replicas, num_partitions,
                   topology.first_replica, topology.first_replica +
                   topology.num_local_replicas - 1, list(topology.groups),
                   ' (chief)' if topology.is_chief else '')
    trainer = trainer_lib.Trainer(p, logdir, log_fn=logging.info,
                                  topology=topology, lock=life.lock, stop=stop)
    # Builds and checks the inputs now, so a missing data set or a batch the
    # model cannot take fails before training (and before any tracing).
    trainer.CheckInputs(train=FLAGS.mode != 'eval',
                        evaluate=FLAGS.mode != 'train')
  except run_life_cycle.StartError as e:
    life.Unlock()
    raise _UserError(str(e)) from None
  except setup_errors as e:
    life.Unlock()
    raise _UserError(f'{type(e).__name__}: {console.OneLine(e)}') from None
  except tf.errors.OpError as e:
    # A worker that answered the peer wait but did not register with TF.
    life.Unlock()
    raise _UserError(f'{type(e).__name__}: {errors.FirstLine(e)}') from None
  return trainer, life


def _Run(trainer, stop: preemption.StopSignals) -> None:
  mode = FLAGS.mode
  if mode in ('train', 'train_and_eval'):
    eval_fn = (lambda step: trainer.Evaluate(restore=False)) if (
        mode == 'train_and_eval') else None
    trainer.Train(eval_fn=eval_fn)
  if mode in ('eval', 'train_and_eval'):
    # After training the weights in memory are those of the last checkpoint.
    restore = mode == 'eval'
    if FLAGS.recompute_bn_stats:
      if restore:
        trainer.RestoreForEval()
        restore = False
      trainer.RecomputeBatchNormStats(FLAGS.recompute_bn_stats)
    metrics = trainer.Evaluate(restore=restore)
    if stop.requested:  # the evaluation ended early; training is saved
      raise preemption.StopRequested(
          stop.signum, int(trainer.global_step.numpy()),
          trainer.latest_checkpoint if trainer.topology.is_chief else None)
    print('final eval: ' + ', '.join(f'{k}={v:.4f}'
                                     for k, v in sorted(metrics.items())))


def _Main(argv):
  console.QuietPythonLogs()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  # SIGTERM / SIGINT: before the first step exit at once with one line, then
  # finish the step, save and exit 128 + N (tensorpipe/preemption.py).
  stop = preemption.StopSignals(prog='trainer', unarmed=(
      'during --mode=eval: no eval results written, the checkpoints are as '
      'they were; run the same command to evaluate again'
      if FLAGS.mode == 'eval' else
      preemption.StopSignals.BEFORE_FIRST_STEP)).Install()
  if not (FLAGS.worker_hosts or os.environ.get('TF_CONFIG', '').strip()):
    # Held since the imports (top of this file); a cluster's life cycle
    # (tensorpipe/run_life_cycle.py) releases them where Python can act:
    # around the peer wait, after registering.
    stop.Release()
  try:
    trainer, life = _Setup(stop)
  except _UserError as e:
    print(f'trainer: error: {e}', file=sys.stderr)
    return 2
  setup_errors, run_errors = _Errors()
  try:
    _Run(trainer, stop)
    life.Finish(0)
  except preemption.StopRequested as e:
    print(f'trainer: {e}', file=sys.stderr)
    life.Finish(e.exit_code)
    return e.exit_code
  except run_errors as e:
    if trainer.topology.num_replicas > 1 and not isinstance(
        e, (FloatingPointError, OSError)) and 'DataFileError' not in type(
            e).__name__:
      # The hint first; TF's message (a collective's graph trace) cut to
      # its first line.
      from tensorpipe import errors  # pylint: disable=g-import-not-at-top
      print('trainer: error: another worker failed or cannot be reached: '
            "relaunch every worker to resume from the chief's newest "
            f'checkpoint ({type(e).__name__}: '
            f'{errors.FirstLine(e, limit=200)})', file=sys.stderr)
      return 1
    print(f'trainer: error: {type(e).__name__}: {console.OneLine(e)}',
          file=sys.stderr)
    return 1
  except setup_errors as e:
    # Found while restoring or tracing: the command as given cannot run.
    print(f'trainer: error: {type(e).__name__}: {console.OneLine(e)}',
          file=sys.stderr)
    return 2
  finally:
    life.Unlock()
  return 0


def main():
  app.run(_Main)


if __name__ == '__main__':
  main()
