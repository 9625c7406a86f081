"""Gated vs ungated weight ops in one process, timed in turn (run from /tmp/gate):
  python pair.py MODEL SETTING [STEPS]"""
import os, sys
sys.path.insert(0, os.getcwd())
model, name = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
from tools.benchmark_lib import runner, settings, plan_check
s = settings.ParseSetting(name)
layer_ps, shape, x = plan_check.ChildInputs(model, max(2, s.num_partitions))
fns = {}
for g in ('', '1'):
  os.environ['GATE'] = g
  layer = runner.BuildLayer(s, layer_ps, shape)
  fns['gate' if g else 'plain'] = runner.StepFn(layer, x, 1e-3)
os.environ['GATE'] = ''
base = runner.StepFn(runner.BuildLayer(settings.ParseSetting('plain'), layer_ps, shape), x, 1e-3)
fns['unpipelined'] = base
wall, cpu = plan_check.TimeInTurn(fns, x, steps)
print('RESULT', model, name, {k: round(v * 1e3, 1) for k, v in wall.items()}, 'gate/plain', round(wall['gate'] / wall['plain'], 3))
