"""Collects a finished run of results/README.md into results/<name>/.

  python results/collect.py NAME LOGDIR CONSOLE_LOG TIME_FILE

writes results/<name>/run.json (command, steps, wall time, final train loss,
the evaluation's metrics from LOGDIR/eval_metrics.json, the sacrebleu
signature when the console has one) and results/<name>/curves.png (training
loss and learning rate against steps, from LOGDIR/train's TensorBoard
events). `python results/collect.py --compare OUT.png NAME NAME ...` overlays
the training losses of several collected runs.
"""

import glob
import json
import os
import re
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

HERE = os.path.dirname(os.path.abspath(__file__))


def Scalars(event_dir):
  """{tag: [(step, value)]} of the TensorBoard scalars in event_dir."""
  out = {}
  for path in sorted(glob.glob(os.path.join(event_dir, 'events.out.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        value = float(tf.make_ndarray(v.tensor)) if v.HasField(
            'tensor') else float(v.simple_value)
        out.setdefault(v.tag, []).append((int(event.step), value))
  return {k: sorted(dict(v).items()) for k, v in out.items()}


def Collect(name, logdir, console, time_file):
  os.makedirs(os.path.join(HERE, name), exist_ok=True)
  with open(time_file) as f:
    lines = f.read().splitlines()
  wall = sum(int(m.group(1)) for m in
             (re.search(r'wall_s (\d+)', l) for l in lines) if m)
  commands = [l for l in lines if l.startswith('python ')]
  with open(console, errors='replace') as f:
    text = f.read()
  signature = re.findall(r'BLEU: sacrebleu (\S+)', text)
  train = Scalars(os.path.join(logdir, 'train'))
  # The console adds step 1 (not a summary step).
  console_loss = {1: float(m.group(1)) for m in re.finditer(
      r'step 1: loss ([0-9.]+)', text)}
  train['loss'] = sorted({**console_loss, **dict(train.get('loss', []))}
                         .items())
  with open(os.path.join(logdir, 'eval_metrics.json')) as f:
    metrics = json.load(f)
  run = dict(name=name, commands=sorted(set(commands)), wall_s=wall,
             runs_of_the_command=len(commands),
             final_train_loss=train['loss'][-1] if 'loss' in train else None,
             eval=metrics)
  if signature:
    run['sacrebleu_signature'] = signature[-1]
  with open(os.path.join(HERE, name, 'run.json'), 'w') as f:
    json.dump(run, f, indent=1, sort_keys=True)
  with open(os.path.join(HERE, name, 'train_scalars.json'), 'w') as f:
    json.dump(train, f)
  fig, ax = plt.subplots(figsize=(6, 4))
  steps, loss = zip(*train['loss'])
  ax.plot(steps, loss, label='training loss')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  ax.set_title(name)
  if 'learning_rate' in train:
    ax2 = ax.twinx()
    s, lr = zip(*train['learning_rate'])
    ax2.plot(s, lr, color='gray', linestyle=':', label='learning rate')
    ax2.set_ylabel('learning rate')
  ax.legend(loc='upper right')
  fig.tight_layout()
  fig.savefig(os.path.join(HERE, name, 'curves.png'), dpi=100)
  print(json.dumps(run, indent=1, sort_keys=True))


def Compare(out, names):
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in names:
    with open(os.path.join(HERE, name, 'train_scalars.json')) as f:
      train = json.load(f)
    steps, loss = zip(*train['loss'])
    ax.plot(steps, loss, label=name, marker='.')
  ax.set_xlabel('step')
  ax.set_ylabel('training loss')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(HERE, out), dpi=100)


if __name__ == '__main__':
  if sys.argv[1] == '--compare':
    Compare(sys.argv[2], sys.argv[3:])
  else:
    Collect(*sys.argv[1:5])
