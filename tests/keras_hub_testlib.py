"""Fits of keras_hub models for the keras_hub slow tests: plain Keras's,
and the bound a pipelined fit of a float64 model that computes parts in
float32 is held to (keras_hub_backbones_slow_test, keras_hub_untied_slow_test).
"""

import keras
import numpy as np


def Tokens(vocab: int, length: int, rows: int):
  """keras_hub's LM inputs: random token_ids, and a padding_mask whose
  every third row ends in 2 padded positions."""
  rng = np.random.default_rng(4)
  mask = np.ones((rows, length), 'int32')
  mask[::3, -2:] = 0
  return {'token_ids': rng.integers(0, vocab, (rows, length)).astype('int32'),
          'padding_mask': mask}


def KerasFit(build, weights, loss, data, sample_weight=None, batch_size=8,
             rows_per_gradient=None):
  """Plain Keras `fit` of `build()` from `weights` (SGD 0.05, one epoch):
  the weights after.

  Every step takes `batch_size` rows. rows_per_gradient=1 makes Keras
  itself compute each step's gradient as the mean of `batch_size` one-row
  gradients (the optimizer's gradient_accumulation_steps), the grouping of
  a pipeline with `batch_size` micro-batches of 1 row, with no tensorpipe
  involved.
  """
  model = build()
  model.set_weights(weights)
  rows_per_gradient = rows_per_gradient or batch_size
  steps = batch_size // rows_per_gradient
  model.compile(keras.optimizers.SGD(
      0.05, gradient_accumulation_steps=steps if steps > 1 else None), loss)
  model.fit(*data, sample_weight=sample_weight, batch_size=rows_per_gradient,
            epochs=1, shuffle=False, verbose=0)
  return model.get_weights()


def Float32Atols(w0, want, rows):
  """Per weight, the bound on |pipelined - Keras fit| for a float64 model
  that computes parts in float32 (Gemma: RMS norm, softmax).

  A float32 op rounds each result by up to u = 2^-24 relative, and its
  kernels round a 1-row batch differently from an 8-row one (vector lanes,
  blocking and reduction order follow the shape, and differ between CPUs:
  AVX2, AVX-512, AMX); a norm's scale gradient is moreover a float32 sum
  over rows x positions (48 terms for the batch, 6 per micro-batch). And
  the update is a sum over rows that can cancel, so its error relative to
  its own size has no useful a-priori bound: it is measured instead, on the
  CPU that runs the test. `rows` is Keras alone computing each step's
  gradient from 1-row slices (the pipeline's grouping), and
  |rows - want| the regrouping noise of this CPU's kernels (measured on
  one CPU: 2e-6 to 9e-5 of the update, by initial weights; 1e-15 for
  GPT-2, float64 throughout).

  The pipeline is held to that plus a floor for what still differs between
  it and `rows`, which group alike: the loss and its float64 gradient taken
  over the whole batch instead of per row, other graph rewrites (1e-16),
  tipping float32 roundings by an ulp. Carried through 13 float32 sections
  (2 RMS norms and a softmax per block, 6 blocks, the final norm) of ~5 ops
  forward and ~10 backward, ~2^8 roundings of u: 2^-16 of the gradient per
  step, 2^-15 over the 2 steps, taken of the weight's largest update
  (measured: at most 3.4e-6 = 2^-18.2 over 9 initialisations). A loss
  scaled by 1 + 1e-3, or a micro-batch missing from the gradient sum, moves
  the update by 1e-3 and ~1/8 of its size.

  Returns:
    One absolute tolerance per weight: max|rows - want| +
    2^-15 max|want - w0|.
  """
  return [float(np.max(np.abs(r - w))) +
          2.0 ** -15 * float(np.max(np.abs(w - a)))
          for r, w, a in zip(rows, want, w0)]
