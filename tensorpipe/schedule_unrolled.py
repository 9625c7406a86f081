"""A compiled schedule without recompute: its table unrolled in Python.

Nothing public in TensorFlow carries a stage's autodiff state from one
tf.while_loop iteration to a later one, so without recompute the table is
not a loop (schedule_engine.Run) but one stage call per cell in the graph:
each forward cell under its own GradientTape, its backward (or I) cell
taking that tape's gradient. The graph holds 2 S T stage calls (3 with I
and W), so it grows with T; `UNROLLED_CELLS_WARNING` says where tracing
gets slow.
"""

from absl import logging
import tensorflow as tf

from tensorpipe import grad_sum
from tensorpipe import py_utils
from tensorpipe import schedule_engine
from tensorpipe import timeline

# Past this many stage calls, tracing takes long enough to warn.
UNROLLED_CELLS_WARNING = 256


def Run(stages, thetas, specs, program, flat_stacked, loss_of, loss_specs,
        normalizer, mb_size, devices) -> schedule_engine.Sums:
  """A compiled schedule without recompute: the table unrolled in Python.

  Each forward cell runs under its own GradientTape, built when the step is
  traced; its backward cell, traced later in table order, takes that
  tape's gradient, so the forward cell's intermediate tensors stay alive
  exactly from the forward to the backward cell (1F1B: at most
  min(K - k, T) micro-batches of activations on device k). A control
  dependency on the previous cell of the same device makes each device run
  its cells in the table's order (the dataflow alone would let every
  forward run first, as in GPipe). The graph holds 2 S T stage calls, so it
  grows with T (the loop's does not).
  """
  num_s, num_d = len(stages), program.num_devices
  num_mb = program.table.num_micro_batches
  probe = timeline.ActiveProbe()
  if 2 * num_s * num_mb > UNROLLED_CELLS_WARNING:
    logging.warning(
        'Schedule %r without recompute unrolls its table: S=%d stages x '
        'T=%d gives %d stage calls in the graph (more than %d), which makes '
        'tracing slow; use recompute=True (a loop whose graph does not grow '
        'with T) or fewer micro-batches', program.table.name, num_s, num_mb,
        2 * num_s * num_mb, UNROLLED_CELLS_WARNING)
  outs, dxs_of, pending, stashed = {}, {}, {}, {}
  dthetas = [[tf.zeros_like(w) for w in tf.nest.flatten(th)]
             for th in thetas]
  split = {(a.micro_batch, a.stage) for row in program.table.grid
           for a in row if a and a.op == 'I'}
  weight_ops = {s: schedule_engine.TraceWeightOps(stages[s], specs[s], thetas[s], mb_size)
                for s in {st for _, st in split}}
  stats = [[schedule_engine.Zeros(ss) for ss in spec.StatsSpecs()] for spec in specs]
  sums = schedule_engine.Zeros(loss_specs)
  previous = [[] for _ in range(num_d)]  # per device: its last cell's results
  rows = [[] for _ in range(num_d)]      # per device: timeline rows
  for c in range(program.num_ticks):
    for d in range(num_d):
      a = program.table.grid[d][c]
      if a is None:
        rows[d].append(probe.Missing(3))
        continue
      s, t = a.stage, program.real[a.micro_batch]
      stage, spec = stages[s], specs[s]
      theta_flat = tf.nest.flatten(thetas[s])
      # A split backward (I, W) watches no weight op's weight (I builds no
      # dw kernel; W takes each op's dw itself).
      op_idx = ([i for i, _, _, _ in weight_ops[s]]
                if (a.micro_batch, s) in split else [])
      watched = [i for i in range(len(theta_flat)) if i not in op_idx]
      with tf.device(devices[d]), tf.control_dependencies(previous[d]):
        if a.op == 'F':
          x = ([tf.gather(v, t) for v in flat_stacked] if s == 0 else
               outs.pop((t, s - 1)))
          start = probe.Stamp(x)
          with tf.GradientTape(watch_accessed_variables=False) as tape, \
              tf.control_dependencies(start):
            # Stage 0's inputs are data: no gradient for them.
            xs = [x[i] for i in spec.float_in] if s > 0 else []
            tape.watch(xs)
            tape.watch([theta_flat[i] for i in watched])
            th = tf.nest.pack_sequence_as(thetas[s], theta_flat)
            with py_utils.CollectWeightOps(tape if op_idx else None) as calls:
              y, cell_stats = stage.FlatCall(spec.in_struct, th, list(x), t,
                                             mb_size)
            if s == num_s - 1:
              l, m = loss_of(y, t)
              ys = [l / normalizer]
              sums = [u + v for u, v in zip(sums, [l] + m)]
            else:
              ys = [y[i] for i in spec.float_out]
              outs[(t, s)] = y
          stats[s] = tf.nest.map_structure(lambda u, v: u + v, stats[s],
                                           cell_stats)
          pending[(t, s)] = (tape, xs, ys, calls, watched)
          end = probe.Stamp([y, cell_stats])
          rows[d].append(start + probe.Missing(1) + end)
          # (With the timeline on, the next cell's start follows this end.)
          previous[d] = y + tf.nest.flatten(cell_stats) + end
        elif a.op == 'W':
          start = probe.Stamp(stashed[(t, s)][1])
          dtheta = list(dthetas[s])
          with tf.control_dependencies(start):
            for (i, _, _, fn), x, dz in zip(weight_ops[s],
                                            *stashed.pop((t, s))):
              with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(theta_flat[i])
                z = fn(x, theta_flat[i])
              dtheta[i] = grad_sum.Accumulate(dtheta[i], tape.gradient(
                  z, theta_flat[i], output_gradients=dz))
          dthetas[s] = dtheta
          end = probe.Stamp(dtheta)
          rows[d].append(start + probe.Missing(1) + end)
          previous[d] = dtheta + end
        else:
          tape, xs, ys, calls, watched = pending.pop((t, s))
          zs = [call.z for call in calls] if a.op == 'I' else []
          dy = None if s == num_s - 1 else dxs_of.pop((t, s + 1))
          start = probe.Stamp(ys + (dy or []))
          with tf.control_dependencies(start):
            dxs, dzs, dws = tape.gradient(
                ys, (xs, zs, [theta_flat[i] for i in watched]),
                output_gradients=dy,
                unconnected_gradients=tf.UnconnectedGradients.ZERO)
          dtheta = list(dthetas[s])
          for i, g in zip(watched, dws):
            dtheta[i] = grad_sum.Accumulate(dtheta[i], g)
          dthetas[s] = dtheta
          if a.op == 'I':
            stashed[(t, s)] = ([call.x for call in calls], list(dzs))
          if s > 0:
            dxs_of[(t, s)] = list(dxs)
          # A backward row without a recompute is (start, -1, end).
          end = probe.Stamp([dxs, dthetas[s]])
          rows[d].append(start + probe.Missing(1) + end)
          previous[d] = list(dxs) + dthetas[s] + end
  assert not (outs or dxs_of or pending or stashed), (outs, dxs_of, pending)
  if probe.recording:
    for d in range(num_d):
      with tf.device(devices[d]):
        probe.Add('table', d, num_d, num_mb, tf.stack([
            tf.stack(row) for row in rows[d]]), table=program.table)
  return schedule_engine.Sums(sums, dthetas, stats)
