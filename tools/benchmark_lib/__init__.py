"""Library of tools/benchmark, one module per job.

  settings  the setting names (plain, plain-T<t>, naive-K, naive-K-serial,
            K<k>-T<t>-rc / -norc / -rcg) and the built-in models: pure.
  runner    the child process: measures one setting of one model (imports
            TensorFlow; sets its threads before any op runs).
  spawn     starts `runner` in a fresh Python process, reads its result.
  results   typed results (Result, Prediction, Report, ...) and their
            results.json form.
  analysis  speed-ups and the simulator's calibrated predictions.
  targets   the issue's targets, written as data, and their evaluation.
  report    the markdown tables (printed and written to tables.md).
  plots     the PNG plots (speed-up, memory, Gantt chart of a step).
  tick_cost --tick_cost: the fixed cost of a pipeline clock tick per
            partition (its child runs as a script on any checkout).
  plan_check --profile and --plan_check: a model's cost profile, and every
            schedule measured against the calibrated cost model's
            prediction and the planner's pick.
  plan_uniform --plan_uniform: GPipe with the layers cut by count against
            the planner's pick, on a model uneven on purpose.
  memory_check --memory_check: the memory model against TF's
            allocator peak, on one device (or two, against a bracket).
  step_profile --step_profile: a step's time with no kernel running and
            each thread's busy time, from TF's profiler.
  remote    --remote_check: stages in TF servers of their own (the
            multi-host path) against one process, and the transfer floor.
  ramp_check --ramp_check: a loss-inside table's ramps run with fixed
            cells against switching ramps, in one process.

Importing the package imports none of them (in particular no TensorFlow).
"""
