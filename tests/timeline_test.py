"""Tests for tensorpipe.timeline: recorded cells follow the GPipe schedule."""

import json

import tensorflow as tf

import tensorpipe
from tensorpipe import schedule_builders
from tensorpipe import schedules
from tensorpipe import simulator
from tensorpipe import test_utils
from tensorpipe import timeline
from tensorpipe.layers import linear

test_utils.ConfigureTestDevices()

_K, _T = 2, 3


def _Layers(n=4, dim=8):
  return [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=dim,
                                      output_dim=dim) for i in range(n)]


def _Step(layer):
  variables = layer.trainable_variables

  def Step(x):
    rec = timeline.Active()
    start = rec.Mark('step_start', [x]) if rec else tf.constant(0.0)
    with tf.control_dependencies([start]):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(layer.FPropDefaultTheta(x))
    grads = tape.gradient(loss, variables)
    updates = [v.assign_sub(0.1 * g) for v, g in zip(variables, grads)]
    if rec:
      rec.Mark('step_end', updates)
      return rec.Tensors()
    return {'loss': loss}
  return Step


def _OpTypes(concrete):
  graph_def = concrete.graph.as_graph_def()
  types = {n.op for n in graph_def.node}
  for f in graph_def.library.function:
    types.update(n.op for n in f.node_def)
  return types


class TimelineTest(tf.test.TestCase):

  def _Record(self, recompute=True):
    layer = tensorpipe.TensorPipeLayer.Params().Set(
        name='pipe', layers=_Layers(), num_partitions=_K,
        num_micro_batches=_T, input_shapes=[[6, 8]],
        recompute=recompute).Instantiate()
    x = tf.random.stateless_uniform([6, 8], seed=[1, 2])
    with timeline.Record() as rec:
      fn = tf.function(_Step(layer)).get_concrete_function(x)
    raw = fn(x)
    return rec, rec.Events(raw), rec.Marks(raw), layer

  def testEveryCellOnceAndDependenciesRespected(self):
    _, events, marks, _ = self._Record()
    cells = {}
    for ev in events:
      key = (ev.phase, ev.t, ev.k)
      self.assertNotIn(key, cells)
      cells[key] = ev
      self.assertLessEqual(ev.start, ev.end)
    want = {(ph, t, k) for ph in timeline.PHASES for t in range(_T)
            for k in range(_K)}
    self.assertEqual(set(cells), want)
    for (ph, t, k), ev in cells.items():
      if ph == 'forward':
        deps = [('forward', t, k - 1), ('forward', t - 1, k)]
      elif ph == 'recompute':
        deps = [('backward', t, k + 1), ('backward', t + 1, k)]
        deps += [('forward', tt, kk) for tt in range(_T) for kk in range(_K)]
      else:
        deps = [('recompute', t, k)]
      for dep in deps:
        if dep in cells:
          self.assertGreaterEqual(ev.start, cells[dep].end, (ph, t, k, dep))
    self.assertLessEqual(marks['step_start'], events[0].start)
    self.assertGreaterEqual(marks['step_end'], max(e.end for e in events))

  def testEventTicksFollowTheSchedule(self):
    _, events, _, _ = self._Record()
    # Each pass logs its own ticks: the gpipe table's F ticks, then its B
    # ticks from `span` on.
    table = schedule_builders.Build('gpipe', _K, _T)
    span = table.num_ticks // 2
    for ev in events:
      fwd = ev.phase == 'forward'
      self.assertEqual(table.grid[ev.k][ev.tick + (0 if fwd else span)],
                       schedules.Action('F' if fwd else 'B', ev.t, ev.k), ev)
    # Row c of a partition's log is its loop's tick c: later ticks start later.
    for phase in timeline.PHASES:
      for k in range(_K):
        mine = sorted((ev for ev in events if (ev.phase, ev.k) == (phase, k)),
                      key=lambda ev: ev.tick)
        starts = [ev.start for ev in mine]
        self.assertEqual(starts, sorted(starts), (phase, k))

  def testChromeTraceAndBreakdown(self):
    _, events, marks, layer = self._Record()
    trace = json.loads(json.dumps(timeline.ChromeTrace(
        events, layer.devices, marks)))
    spans = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    self.assertLen(spans, 3 * _K * _T)
    self.assertEqual({e['tid'] for e in spans}, set(range(_K)))
    for e in spans:
      self.assertGreaterEqual(e['ts'], 0)
      self.assertIn(e['args']['phase'], timeline.PHASES)
    names = [e['args']['name'] for e in trace['traceEvents']
             if e['ph'] == 'M']
    self.assertEqual(len(names), _K)
    parts = timeline.Breakdown(events, _K, marks['step_start'],
                               marks['step_end'])
    # The busy categories are each device's time in its cells, averaged.
    for phase in timeline.PHASES:
      busy = sum(e.end - e.start for e in events if e.phase == phase) / _K
      self.assertAllClose(parts[phase], busy, rtol=1e-9, msg=phase)
    self.assertGreater(parts['recompute'], 0)

  def testBreakdownOfAHandWrittenTimeline(self):
    # K=2, T=2, seconds. Partition 1 is twice as slow as partition 0.
    ev = timeline.Event
    events = [
        ev('forward', 0, 0, 1.0, 2.0), ev('forward', 0, 1, 2.0, 3.0),
        ev('forward', 1, 0, 2.0, 4.0), ev('forward', 1, 1, 4.0, 6.0),
        ev('recompute', 1, 1, 8.0, 9.0), ev('backward', 1, 1, 9.0, 11.0),
        ev('recompute', 1, 0, 11.0, 12.0), ev('backward', 1, 0, 12.0, 14.0),
        ev('recompute', 0, 1, 11.0, 11.5), ev('backward', 0, 1, 11.5, 12.5),
        ev('recompute', 0, 0, 14.0, 14.5), ev('backward', 0, 0, 14.5, 16.0)]
    parts = timeline.Breakdown(events, 2, step_start=0.0, step_end=20.0)
    # By hand: busy k0 = 2 + 1 + 2.5 = 5.5, k1 = 4 + 2 + 4 = 10.
    self.assertEqual(parts, {
        'forward': (2 + 4) / 2,
        'recompute': (1 + 2) / 2,
        'backward': (2.5 + 4) / 2,
        # mean over k of (max busy - busy_k)
        'load_imbalance': (10 - 5.5) / 2,
        # loop spans 5 (forward, 1..6) + 8 (backward, 8..16), minus the mean
        # busy time 7.75, minus the imbalance
        'bubble': 5 + 8 - 7.75 - 2.25,
        # step start to the first cell, plus the gap between the loops
        'setup': 1.0 + 2.0,
        'weight_update': 20.0 - 16.0,
        'step': 20.0})

  def testNoRecomputeRecordsForwardOnly(self):
    _, events, marks, _ = self._Record(recompute=False)
    self.assertEqual({e.phase for e in events}, {'forward'})
    self.assertLen(events, _K * _T)
    parts = timeline.Breakdown(events, _K, marks['step_start'],
                               marks['step_end'])
    self.assertNotIn('weight_update', parts)
    self.assertGreater(parts['backward_and_weight_update'], 0)

  def testNoTimestampOpsWhenOff(self):
    layer = tensorpipe.TensorPipeLayer.Params().Set(
        name='pipe', layers=_Layers(), num_partitions=_K,
        num_micro_batches=_T, input_shapes=[[6, 8]]).Instantiate()
    x = tf.zeros([6, 8])
    off = tf.function(_Step(layer)).get_concrete_function(x)
    self.assertNotIn('Timestamp', _OpTypes(off))
    with timeline.Record():
      on = tf.function(_Step(layer)).get_concrete_function(x)
    self.assertIn('Timestamp', _OpTypes(on))

  def testRecordingKeepsPartitionsOfATickConcurrent(self):
    # tf.timestamp is stateful: without timeline.Unordered, automatic control
    # dependencies chained partition 1's cond after partition 0's in every
    # tick, so the recorded (and the recording) schedule was serial.
    for recompute in (True, False):
      layer = tensorpipe.TensorPipeLayer.Params().Set(
          name='pipe', layers=_Layers(), num_partitions=_K,
          num_micro_batches=_T, input_shapes=[[6, 8]],
          recompute=recompute).Instantiate()
      x = tf.zeros([6, 8])
      with timeline.Record():
        fn = tf.function(_Step(layer)).get_concrete_function(x)
      conds = [(f.signature.name, n) for f in
               fn.graph.as_graph_def().library.function
               for n in f.node_def if n.op in ('If', 'StatelessIf')]
      self.assertGreaterEqual(len(conds), _K * (2 if recompute else 1))
      for fname, node in conds:
        ctrl = [i for i in node.input if i.startswith('^')]
        self.assertEqual(ctrl, [], f'{fname}/{node.name} is ordered after '
                         f'{ctrl}')


# K=2, T=2, a 1F1B step by hand (seconds). The schedule:
#   tick   0   1   2   3   4   5
#   k=0    F0  F1      B0      B1
#   k=1        F0  B0  F1  B1
_M = -1.0
_LOGS_1F1B = [
    [[0.0, _M, 1.0], [1.0, _M, 2.0], [_M, _M, _M], [5.0, 6.0, 8.0],
     [_M, _M, _M], [9.0, 10.0, 12.0]],
    [[_M, _M, _M], [1.0, _M, 2.0], [2.5, 3.5, 5.0], [5.0, _M, 7.0],
     [7.0, 8.0, 9.0], [_M, _M, _M]],
]


def _Decode1F1B(logs, k_total, t_total):
  """Decodes per-device logs of the 1f1b table's ticks, as the engine's."""
  rec = timeline.Recorder()
  table = schedule_builders.Build('1f1b', k_total, t_total)
  for k, log in enumerate(logs):
    rec.Add('table', k, k_total, t_total, tf.constant(log, tf.float64),
            table=table)
  return rec.Events(rec.Tensors())


class OneFOneBTimelineTest(tf.test.TestCase):
  """Decoding and breakdown of 1F1B logs (one clock, interleaved passes)."""

  def testHandWrittenLogDecodesWithTheSchedule(self):
    ev = timeline.Event
    self.assertEqual(_Decode1F1B(_LOGS_1F1B, 2, 2), [
        ev('forward', 0, 0, 0.0, 1.0, tick=0, stage=0),
        ev('forward', 0, 1, 1.0, 2.0, tick=1, stage=0),
        ev('forward', 1, 0, 1.0, 2.0, tick=1, stage=1),
        ev('recompute', 1, 0, 2.5, 3.5, tick=2, stage=1),
        ev('backward', 1, 0, 3.5, 5.0, tick=2, stage=1),
        ev('recompute', 0, 0, 5.0, 6.0, tick=3, stage=0),
        ev('forward', 1, 1, 5.0, 7.0, tick=3, stage=1),
        ev('backward', 0, 0, 6.0, 8.0, tick=3, stage=0),
        ev('recompute', 1, 1, 7.0, 8.0, tick=4, stage=1),
        ev('backward', 1, 1, 8.0, 9.0, tick=4, stage=1),
        ev('recompute', 0, 1, 9.0, 10.0, tick=5, stage=0),
        ev('backward', 0, 1, 10.0, 12.0, tick=5, stage=0)])

  def testBreakdownOfAnInterleavedStep(self):
    events = _Decode1F1B(_LOGS_1F1B, 2, 2)
    parts = timeline.Breakdown(events, 2, step_start=-0.5, step_end=13.0)
    # busy k0 = 2 + 2 + 4 = 8, k1 = 3 + 2 + 2.5 = 7.5; one loop from 0 to 12.
    self.assertEqual(parts, {
        'forward': (2 + 3) / 2,
        'recompute': (2 + 2) / 2,
        'backward': (4 + 2.5) / 2,
        'load_imbalance': (0 + 0.5) / 2,
        'bubble': 12 - 7.75 - 0.25,
        'setup': 0.5,
        'weight_update': 1.0,
        'step': 13.5})

  def testLogsOfASimulatedStepRoundTrip(self):
    # Write the simulator's 1F1B cells into per-partition logs at their
    # schedule ticks, as the loop does; decoding gives the cells back.
    k_total, t_total = 3, 5
    for rc in (True, False):
      table = schedule_builders.Build('1f1b', k_total, t_total)
      res = simulator.SimulateSchedule(table, [1.0, 3.0, 2.0],
                                       [2.0, 1.0, 4.0], recompute=rc,
                                       synchronous_ticks=True)
      tick = {a: c for a, (_, c) in table.Ticks().items()}
      logs = [[[_M] * 3 for _ in range(table.num_ticks)]
              for _ in range(k_total)]
      for c in res.cells:
        mid = c.start + c.recompute if c.recompute else _M
        action = schedules.Action(c.phase[0].upper(), c.t, c.k)
        logs[c.k][tick[action]] = [c.start, mid, c.end]
      events = _Decode1F1B(logs, k_total, t_total)
      want = []
      for c in res.cells:
        if c.recompute:
          want += [('recompute', c.k, c.t, c.start, c.start + c.recompute),
                   ('backward', c.k, c.t, c.start + c.recompute, c.end)]
        else:
          want.append((c.phase, c.k, c.t, c.start, c.end))
      self.assertCountEqual(
          [(e.phase, e.k, e.t, e.start, e.end) for e in events], want)
      self.assertLen(events, (3 if rc else 2) * k_total * t_total)
      # The breakdown's busy time is the simulator's.
      parts = timeline.Breakdown(events, k_total, 0.0, res.step_time)
      self.assertAllClose(
          parts['forward'] + parts['recompute'] + parts['backward'],
          sum(res.busy) / k_total)
      self.assertAllClose(sum(v for n, v in parts.items() if n != 'step'),
                          res.step_time)
      trace = timeline.ChromeTrace(events, ['/CPU:0', '/CPU:1', '/CPU:2'])
      self.assertLen([e for e in trace['traceEvents'] if e['ph'] == 'X'],
                     len(events))

  def testEventsAndTraceNameTheVirtualStage(self):
    # interleaved_1f1b, K=2 devices x v=2 stages: device k holds stages k
    # and k + 2; each recorded cell names the stage the table ran there.
    table = schedule_builders.Build('interleaved_1f1b', 2, 2, 2)
    rec = timeline.Recorder()
    for k in range(2):
      log = [[float(c), _M, c + 0.5] if a else [_M] * 3
             for c, a in enumerate(table.grid[k])]
      rec.Add('table', k, 2, 2, tf.constant(log, tf.float64), table=table)
    events = rec.Events(rec.Tensors())
    self.assertCountEqual({(e.k, e.stage) for e in events},
                          {(0, 0), (0, 2), (1, 1), (1, 3)})
    for e in events:
      self.assertEqual(table.grid[e.k][e.tick].stage, e.stage)
    trace = timeline.ChromeTrace(events, ['/CPU:0', '/CPU:1'])
    spans = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    self.assertIn('F t=1 s=3', {e['name'] for e in spans})
    self.assertEqual({(e['tid'], e['args']['stage']) for e in spans},
                     {(0, 0), (0, 2), (1, 1), (1, 3)})

  def testTwoColumnLogHasNoRecomputeSplit(self):
    logs = [[row[0], row[2]] for row in _LOGS_1F1B[1]]
    events = _Decode1F1B([[[_M, _M]] * 6, logs], 2, 2)
    self.assertEqual([(e.phase, e.t, e.start, e.end) for e in events], [
        ('forward', 0, 1.0, 2.0), ('backward', 0, 2.5, 5.0),
        ('forward', 1, 5.0, 7.0), ('backward', 1, 7.0, 9.0)])

  def testProbeLogsOfALoopDecode(self):
    # What the engine does: Probe.NewLog / Log per tick, Add('table').
    rec = timeline.Recorder()
    probe = timeline.Probe(rec)
    table = schedule_builders.Build('1f1b', 1, 2)
    log = probe.NewLog(table.num_ticks, 3)
    for clock, stamps in ((0, [1.0, _M, 2.0]), (1, [2.0, 3.0, 4.0]),
                          (2, [4.0, _M, 5.0]), (3, [5.0, 6.0, 7.0])):
      log = probe.Log(log, tf.constant(clock),
                      [tf.constant(v, tf.float64) for v in stamps])
    probe.Add('table', 0, 1, 2, log, table=table)
    self.assertEqual(
        [(e.phase, e.t, e.start, e.end, e.tick)
         for e in rec.Events(rec.Tensors())],
        [('forward', 0, 1.0, 2.0, 0), ('recompute', 0, 2.0, 3.0, 1),
         ('backward', 0, 3.0, 4.0, 1), ('forward', 1, 4.0, 5.0, 2),
         ('recompute', 1, 5.0, 6.0, 3), ('backward', 1, 6.0, 7.0, 3)])

  def testRecordedSwitchCasesOfATickStayConcurrent(self):
    # The 1F1B loop picks idle / forward / backward per partition with a
    # tf.switch_case; recording stamps make it stateful, and without
    # Probe.SwitchCase the partitions' cases would be chained in order.
    probe = timeline.Probe(timeline.Recorder())

    def Fn(op, x):
      outs = []
      for k in range(2):
        outs.append(probe.SwitchCase(op, [
            lambda: x + 0.0,
            lambda k=k: x * float(k + 2) + tf.cast(
                probe.Stamp([x])[0], tf.float32) * 0.0,
            lambda: x - 1.0]))
      return outs
    fn = tf.function(Fn).get_concrete_function(
        tf.TensorSpec([], tf.int32), tf.TensorSpec([]))
    cases = [n for n in fn.graph.as_graph_def().node
             if n.op in ('Case', 'StatelessCase')]
    self.assertLen(cases, 2)
    for node in cases:
      self.assertEqual([i for i in node.input if i.startswith('^')], [],
                       node.name)
    self.assertAllEqual(fn(tf.constant(1), tf.constant(3.0)), [6.0, 9.0])
    off = timeline.Probe(None)
    self.assertEqual(float(off.SwitchCase(
        tf.constant(2), [lambda: 0.0, lambda: 1.0, lambda: 2.0])), 2.0)

  def testRejectsLogsThatDoNotFitTheSchedule(self):
    # A log covers ticks [first, first + rows) of the table: a longer one is
    # of another schedule or K, T.
    with self.assertRaisesRegex(ValueError, r'7 rows.*K=2, T=2 has 6 ticks'):
      _Decode1F1B([_LOGS_1F1B[0] + [[_M] * 3], _LOGS_1F1B[1]], 2, 2)
    idle_ran = [list(r) for r in _LOGS_1F1B[0]]
    idle_ran[2] = [2.0, _M, 3.0]
    with self.assertRaisesRegex(ValueError, 'tick 2, where the schedule '
                                'idles'):
      _Decode1F1B([idle_ran, _LOGS_1F1B[1]], 2, 2)
    for gone in ('pipedream', '1f1b', 'backward'):
      with self.assertRaisesRegex(ValueError, rf"'{gone}' is not one of "
                                  r"\('forward', 'table'\)"):
        timeline.Recorder().Add(gone, 0, 1, 1, tf.zeros([2, 2]))


class ProbeTest(tf.test.TestCase):

  def testOffBuildsNothing(self):
    probe = timeline.Probe(None)

    def Fn(x):
      self.assertEqual(probe.Stamp([x]), [])
      self.assertEqual(probe.Missing(3), [])
      self.assertEqual(probe.Mask(x > 0, []), [])
      log = probe.NewLog(4, 2)
      self.assertEqual(log, ())
      self.assertIs(probe.Log(log, tf.constant(1), []), log)
      self.assertEqual(probe.OneTickLog([]), ())
      probe.Add('forward', 0, 1, 1, log)
      return probe.Cond(x > 0, lambda: x + 1.0, lambda: x - 1.0)
    fn = tf.function(Fn).get_concrete_function(tf.TensorSpec([]))
    self.assertNotIn('Timestamp', _OpTypes(fn))
    self.assertEqual(float(fn(tf.constant(2.0))), 3.0)

  def testOnWritesTickRowsForTheRecorder(self):
    rec = timeline.Recorder()
    probe = timeline.Probe(rec)
    stamp = lambda v: tf.constant(v, tf.float64)
    self.assertLen(probe.Stamp(), 1)
    self.assertAllEqual(probe.Missing(2), [-1.0, -1.0])
    self.assertAllEqual(probe.Mask(tf.constant(False), [stamp(2.0)]), [-1.0])
    log = probe.Log(probe.NewLog(3, 2), tf.constant(1),
                    [stamp(5.0), stamp(6.0)])
    self.assertAllEqual(log, [[-1, -1], [5, 6], [-1, -1]])
    probe.Add('forward', 0, 2, 2, log)
    # K=2, T=2: partition 0 runs micro-batch 1 on forward tick 1.
    self.assertEqual(rec.Events(rec.Tensors()),
                     [timeline.Event('forward', 0, 1, 5.0, 6.0, tick=1,
                                     stage=0)])


if __name__ == '__main__':
  tf.test.main()
