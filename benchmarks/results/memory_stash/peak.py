"""Allocator peak of one step of a setting (memory_check's way: one
intra-op and one inter-op thread, plan_check.ChildInputs), cells isolated
(last argument 1) or inline (0). Run from a checkout's root:
  python peak.py dense32mem 4 zbh1-rc 1"""
import os, sys
os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'
sys.path.insert(0, os.getcwd())
model, tt, tag, iso = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == '1'
import tensorflow as tf
from tensorpipe import devices, schedule_program, cell_profile, model_analysis, schedule_plan
from tools.benchmark_lib import runner, settings, plan_check
layer_ps, shape, x = plan_check.ChildInputs(model, 1)
s = settings.ParseSetting(f'K1-T{tt}-{tag}')
with schedule_program.IsolatedCells(iso):
  layer = runner.BuildLayer(s, layer_ps, shape)
  step = runner.StepFn(layer, x, 1e-3)
for _ in range(2):
  step(x)[0].numpy()
m = tf.config.experimental.get_memory_info('CPU:0')
tf.config.experimental.reset_memory_stats('CPU:0')
before = tf.config.experimental.get_memory_info('CPU:0')['current']
step(x)[0].numpy()
peak = tf.config.experimental.get_memory_info('CPU:0')['peak'] - before
report = model_analysis.AnalyzeLayers(layer_ps, [shape], num_partitions=1, num_micro_batches=tt, exact_optimizer_state=False)
act, stash = schedule_plan.TableMemory(report, settings.ScheduleTable(s), cell_profile.StageCut(layer), 'norc' not in tag)
print(f'RESULT {model} T={tt} {tag} iso={int(iso)} before={before/2**20:.1f} measured={peak/2**20:.1f} predicted={max(act)/2**20:.1f} stash={max(stash)/2**20:.1f}')
