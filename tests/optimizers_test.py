"""Tests of tensorpipe.optimizers against tf-keras and NumPy oracles."""

import os
import tempfile

import numpy as np
import tensorflow as tf
import tf_keras

from tensorpipe import optimizers
from tensorpipe import test_utils

test_utils.ConfigureTestDevices()

# Changing learning rates: an update whose lr enters in the wrong place (e.g.
# m = mu m + g; W -= lr m instead of m = mu m - lr g; W += m) differs.
_LRS = [0.1, 0.03, 0.25, 0.01, 0.07, 0.15]
_SHAPES = [[3, 5], [5], [2, 3, 4], []]


def _Grads(dtype=np.float32, seed=0):
  rng = np.random.RandomState(seed)
  return [[np.asarray(rng.randn(*s), dtype) for s in _SHAPES] for _ in _LRS]


def _InitialValues(dtype=np.float32):
  rng = np.random.RandomState(100)
  return [np.asarray(rng.randn(*s), dtype) for s in _SHAPES]


def _Ours(p, dtype=np.float32, seed=0, in_function=False):
  """Runs optimizer Params `p` over _LRS; returns (weights, optimizer)."""
  variables = [tf.Variable(w, name=f'w{i}')
               for i, w in enumerate(_InitialValues(dtype))]
  opt = p.Instantiate()
  opt.Build({f'layer{i}/w': v for i, v in enumerate(variables)})
  apply_fn = tf.function(opt.Apply) if in_function else opt.Apply
  for lr, grads in zip(_LRS, _Grads(dtype, seed)):
    apply_fn(tf.constant(lr, tf.float32), [tf.constant(g) for g in grads],
             variables)
  return [v.numpy() for v in variables], opt


def _Keras(make, dtype=np.float32, seed=0):
  """The same run with a tf-keras optimizer (the previous implementation)."""
  variables = [tf.Variable(w) for w in _InitialValues(dtype)]
  opt = make()
  for lr, grads in zip(_LRS, _Grads(dtype, seed)):
    opt.learning_rate.assign(lr)
    opt.apply_gradients(zip([tf.constant(g) for g in grads], variables))
  return [v.numpy() for v in variables]


# (our Params, the tf-keras optimizer they replace). jit_compile=False: on
# CPU tf-keras turns XLA off itself; on GPU it would compile the update.
_CASES = {
    'sgd': (optimizers.SGD.Params(),
            lambda: tf_keras.optimizers.SGD(0.0, momentum=0.9,
                                            jit_compile=False)),
    'sgd_nesterov': (
        optimizers.SGD.Params().Set(momentum=0.8, nesterov=True),
        lambda: tf_keras.optimizers.SGD(0.0, momentum=0.8, nesterov=True,
                                        jit_compile=False)),
    'sgd_plain': (optimizers.SGD.Params().Set(momentum=0.0),
                  lambda: tf_keras.optimizers.SGD(0.0, jit_compile=False)),
    'rmsprop': (optimizers.RMSProp.Params(),
                lambda: tf_keras.optimizers.RMSprop(
                    0.0, rho=0.9, epsilon=0.1, jit_compile=False)),
    'rmsprop_momentum': (
        optimizers.RMSProp.Params().Set(decay=0.95, momentum=0.5,
                                        epsilon=1e-3),
        lambda: tf_keras.optimizers.RMSprop(
            0.0, rho=0.95, momentum=0.5, epsilon=1e-3, jit_compile=False)),
    'adam': (optimizers.Adam.Params(),
             lambda: tf_keras.optimizers.Adam(0.0, jit_compile=False)),
    'adam_betas': (
        optimizers.Adam.Params().Set(beta1=0.5, beta2=0.9, epsilon=1e-3),
        lambda: tf_keras.optimizers.Adam(0.0, beta_1=0.5, beta_2=0.9,
                                         epsilon=1e-3, jit_compile=False)),
}


def _NumpySgd(w, m, g, lr, mu=0.9, nesterov=False):
  m = mu * m - lr * g
  return (w + mu * m - lr * g if nesterov else w + m), m


def _NumpyAdam(w, s, g, lr, t, b1=0.9, b2=0.999, eps=1e-7):
  """One Adam step (module docstring); s = (m, v) or None at t = 1."""
  m, v = (0.0, 0.0) if s is None else s
  m = m + (g - m) * (1 - b1)
  v = v + (g * g - v) * (1 - b2)
  alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
  return w - m * alpha / (np.sqrt(v) + eps), (m, v)


def _NumpyAdafactor(w, grads, lr, beta1=0.9, decay=-0.8, eps=1e-30,
                    clip=1.0, factored=True):
  """Reference Adafactor (module docstring) in NumPy."""
  w = w.astype(np.float64).copy()
  m = np.zeros_like(w)
  vr = np.zeros(w.shape[:-1])
  vc = np.zeros(w.shape[:-2] + w.shape[-1:])
  v = np.zeros_like(w)
  for t, g in enumerate(grads, 1):
    beta2 = 1.0 - t ** decay
    g2 = g * g + eps
    if factored:
      vr = beta2 * vr + (1 - beta2) * g2.mean(-1)
      vc = beta2 * vc + (1 - beta2) * g2.mean(-2)
      vhat = np.outer(vr / vr.mean(), vc)
    else:
      v = beta2 * v + (1 - beta2) * g2
      vhat = v
    u = g / np.sqrt(vhat)
    u = u / max(1.0, np.sqrt(np.mean(u * u)) / clip)
    m = beta1 * m + (1 - beta1) * u
    w -= lr * m
  return w


class OptimizersTest(tf.test.TestCase):

  def _Run(self, opt, w0, grads, lr):
    v = tf.Variable(w0)
    for g in grads:
      opt.Apply(lr, [tf.constant(g)], [v])
    return v.numpy()

  def testMatchesTfKerasBitwiseEager(self):
    for name, (p, make) in _CASES.items():
      got, _ = _Ours(p)
      want = _Keras(make)
      for i, (a, b) in enumerate(zip(got, want)):
        self.assertAllEqual(a, b, msg=f'{name} variable {i}')

  def testMatchesTfKerasBitwiseInFunction(self):
    # The trainer applies updates inside a tf.function (Grappler rewrites).
    for name in ('sgd_nesterov', 'rmsprop_momentum', 'adam'):
      p, make = _CASES[name]
      got, _ = _Ours(p, in_function=True)
      variables = [tf.Variable(w) for w in _InitialValues()]
      kopt = make()

      @tf.function
      def KerasStep(lr, grads, kopt=kopt, variables=variables):
        kopt.learning_rate.assign(lr)
        kopt.apply_gradients(zip(grads, variables))
      for lr, grads in zip(_LRS, _Grads()):
        KerasStep(tf.constant(lr), [tf.constant(g) for g in grads])
      for i, (a, b) in enumerate(zip(got, variables)):
        self.assertAllEqual(a, b.numpy(), msg=f'{name} variable {i}')

  def testModuleDocstringFormulasInFloat64(self):
    """The documented updates, in NumPy float64, with rounding-level error."""
    w0 = [w.astype(np.float64) for w in _InitialValues(np.float64)]
    grads = _Grads(np.float64)
    lrs = np.float32(_LRS).astype(np.float64)  # Apply takes a float32 lr.

    def Check(p, update):
      got, _ = _Ours(p, np.float64)
      state = [None] * len(w0)
      want = [w.copy() for w in w0]
      for t, (lr, gs) in enumerate(zip(lrs, grads), 1):
        for i, g in enumerate(gs):
          want[i], state[i] = update(want[i], state[i], g, lr, t)
      # The code and NumPy round differently (the order of products, rsqrt
      # vs 1 / sqrt): each of the 6 steps adds at most ~8 roundings of
      # 0.5 ulp on values of magnitude <= max(|W|, 1), under 64 eps in all.
      tol = 64 * np.finfo(np.float64).eps
      for a, b in zip(got, want):
        self.assertAllClose(a, b, rtol=tol, atol=tol)

    def Sgd(w, m, g, lr, t, mu, nesterov):
      del t
      return _NumpySgd(w, 0.0 if m is None else m, g, lr, mu, nesterov)
    Check(optimizers.SGD.Params(),
          lambda w, s, g, lr, t: Sgd(w, s, g, lr, t, 0.9, False))
    Check(optimizers.SGD.Params().Set(momentum=0.8, nesterov=True),
          lambda w, s, g, lr, t: Sgd(w, s, g, lr, t, 0.8, True))

    def RmsProp(w, s, g, lr, t, decay=0.95, mu=0.5, eps=1e-3):
      del t
      v, m = (0.0, 0.0) if s is None else s
      v = decay * v + (1 - decay) * g * g
      m = mu * m + lr * g / np.sqrt(v + eps)
      return w - m, (v, m)
    Check(optimizers.RMSProp.Params().Set(decay=0.95, momentum=0.5,
                                          epsilon=1e-3), RmsProp)

    def Adam(w, s, g, lr, t, b1=0.9, b2=0.999, eps=1e-7):
      m, v = (0.0, 0.0) if s is None else s
      m = m + (g - m) * (1 - b1)
      v = v + (g * g - v) * (1 - b2)
      alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
      return w - m * alpha / (np.sqrt(v) + eps), (m, v)
    Check(optimizers.Adam.Params(), Adam)

  def testSameShapeVariablesKeepTheirOwnSlots(self):
    """Two [3, 5] variables, gradients of different scales, passed to Apply
    in alternating order: each follows its own NumPy trajectory. Slots taken
    by list position instead of by variable (a mix-up no shape check
    catches) would give each variable the other's momentum every other step.
    """
    rng = np.random.RandomState(7)
    w0 = [rng.randn(3, 5) for _ in range(2)]
    grads = [[rng.randn(3, 5) * scale for scale in (1.0, 30.0)]
             for _ in _LRS]
    lrs = np.float32(_LRS).astype(np.float64)  # Apply takes a float32 lr.

    def Sgd(w, s, g, lr, t):
      del t
      return _NumpySgd(w, 0.0 if s is None else s, g, lr)

    tol = 64 * np.finfo(np.float64).eps
    for name, p, update in [('sgd', optimizers.SGD.Params(), Sgd),
                            ('adam', optimizers.Adam.Params(), _NumpyAdam)]:
      with self.subTest(name):
        variables = [tf.Variable(w) for w in w0]
        opt = p.Instantiate()
        opt.Build({'a/w': variables[0], 'b/w': variables[1]})
        want, state = [w.copy() for w in w0], [None, None]
        mixed, mixed_state = [w.copy() for w in w0], [None, None]
        for t, (lr, gs) in enumerate(zip(lrs, grads), 1):
          order = [0, 1] if t % 2 else [1, 0]
          opt.Apply(lr, [tf.constant(gs[i]) for i in order],
                    [variables[i] for i in order])
          for i in range(2):
            want[i], state[i] = update(want[i], state[i], gs[i], lr, t)
          # The mix-up: the variable at list position j uses slot j.
          new_state = list(mixed_state)
          for j, i in enumerate(order):
            mixed[i], new_state[j] = update(mixed[i], mixed_state[j], gs[i],
                                            lr, t)
          mixed_state = new_state
        for i in range(2):
          self.assertAllClose(variables[i].numpy(), want[i], rtol=tol,
                              atol=tol, msg=f'variable {i}')
          self.assertNotAllClose(mixed[i], want[i], rtol=1e-6, atol=1e-6)

  def testRMSPropDefaultsArePaperRecipe(self):
    p = optimizers.RMSProp.Params()
    self.assertEqual((p.decay, p.momentum, p.epsilon), (0.9, 0.0, 0.1))
    opt = p.Instantiate()
    w0 = np.array([1.0, -2.0, 3.0], np.float32)
    grads = [np.array([0.5, -1.0, 2.0], np.float32),
             np.array([0.1, 0.3, -0.2], np.float32)]
    w, ms = w0.astype(np.float64), np.zeros(3)
    for g in grads:
      ms = 0.9 * ms + 0.1 * g * g
      w = w - 0.01 * g / np.sqrt(ms + 0.1)
    self.assertAllClose(self._Run(opt, w0, grads, 0.01), w, rtol=1e-5)
    self.assertEqual(sorted(opt.slots['Variable']), ['v'])

  def testUpdateDoesNotDependOnVariableOrder(self):
    p = _CASES['adam'][0]
    got, _ = _Ours(p)
    variables = [tf.Variable(w) for w in _InitialValues()]
    opt = p.Instantiate()
    opt.Build({f'layer{i}/w': v for i, v in enumerate(variables)})
    for lr, grads in zip(_LRS, _Grads()):
      opt.Apply(lr, [tf.constant(g) for g in grads][::-1], variables[::-1])
    for a, b in zip(got, variables):
      self.assertAllEqual(a, b.numpy())

  def testSlotsAreOnTheirVariablesDevice(self):
    devices = ['/CPU:1', '/CPU:2', '/CPU:3']
    variables = {}
    for k, d in enumerate(devices):
      with tf.device(d):
        variables[f'stage{k}/w'] = tf.Variable(tf.ones([2, 2]))
    for p in (optimizers.SGD.Params(), optimizers.Adam.Params(),
              optimizers.RMSProp.Params().Set(momentum=0.9),
              optimizers.Adafactor.Params().Set(min_dim_size_to_factor=2)):
      opt = p.Instantiate()
      opt.Build(variables)
      for path, v in variables.items():
        self.assertNotEmpty(opt.slots[path])
        for slot in opt.slots[path].values():
          self.assertEqual(tf.DeviceSpec.from_string(slot.device),
                           tf.DeviceSpec.from_string(v.device), msg=path)
      # Model variables are not the optimizer's own.
      self.assertEmpty(opt.trainable_variables)
      self.assertEqual(
          len(opt.variables),
          1 + sum(len(s) for s in opt.slots.values()))

  def testAppliesInReplicaContext(self):
    # Variables made outside the strategy's scope, as pipeline stages are;
    # tf-keras optimizers refuse these.
    strategy = tf.distribute.MirroredStrategy(['/CPU:0'])
    p = _CASES['rmsprop_momentum'][0]
    # Grappler rewrites a graph's arithmetic (within a few ulps of eager
    # execution), so the reference runs in a tf.function too.
    want, _ = _Ours(p, in_function=True)
    variables = [tf.Variable(w) for w in _InitialValues()]
    opt = p.Instantiate()
    opt.Build({f'layer{i}/w': v for i, v in enumerate(variables)})

    @tf.function
    def Step(lr, grads):
      def Replica(lr, grads):
        self.assertIsNotNone(tf.distribute.get_replica_context())
        opt.Apply(lr, grads, variables)
      strategy.run(Replica, args=(lr, grads))
    for lr, grads in zip(_LRS, _Grads()):
      Step(tf.constant(lr), [tf.constant(g) for g in grads])
    for a, b in zip(want, variables):
      self.assertAllEqual(a, b.numpy())

  def testBuildInsideStrategyScopeRaises(self):
    strategy = tf.distribute.MirroredStrategy(['/CPU:0'])
    v = tf.Variable(1.0)
    opt = optimizers.SGD.Params().Instantiate()
    with strategy.scope():
      with self.assertRaisesRegex(ValueError, 'outside strategy.scope'):
        opt.Build({'w': v})

  def testCheckpointKeysArePaths(self):
    variables = {'model/fc0/w': tf.Variable(tf.ones([2])),
                 'model/fc.1/b': tf.Variable(tf.ones([2]))}
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(variables)
    path = tf.train.Checkpoint(optimizer=opt).save(
        os.path.join(tempfile.mkdtemp(), 'c'))
    keys = {k for k, _ in tf.train.list_variables(path)}
    # tf.train.Checkpoint escapes '/' as '.S' and '.' as '..' in names.
    for escaped in ('model.Sfc0.Sw', 'model.Sfc..1.Sb'):
      for slot in ('m', 'v'):
        self.assertIn(f'optimizer/slots/{escaped}/{slot}/.ATTRIBUTES/'
                      'VARIABLE_VALUE', keys)
    self.assertIn('optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE', keys)

  def testSlotsAreCheckpointed(self):
    rng = np.random.RandomState(2)
    grads = [rng.randn(3, 3).astype(np.float32) for _ in range(4)]
    makers = [optimizers.Adafactor.Params().Set(min_dim_size_to_factor=2),
              optimizers.RMSProp.Params().Set(momentum=0.5),
              optimizers.SGD.Params(), optimizers.Adam.Params()]
    for p in makers:
      v = tf.Variable(np.ones([3, 3], np.float32), name='w')
      opt = p.Instantiate()
      for g in grads[:2]:
        opt.Apply(0.1, [g], [v])
      ckpt = tf.train.Checkpoint(v=v, opt=opt)
      path = ckpt.save(os.path.join(tempfile.mkdtemp(), 'c'))
      for g in grads[2:]:
        opt.Apply(0.1, [g], [v])
      want = v.numpy()
      v2 = tf.Variable(np.zeros([3, 3], np.float32), name='w')
      opt2 = p.Instantiate()
      opt2.Build([v2])
      tf.train.Checkpoint(v=v2, opt=opt2).restore(path).assert_consumed()
      self.assertEqual(int(opt2.iterations.numpy()), 2)
      for g in grads[2:]:
        opt2.Apply(0.1, [g], [v2])
      self.assertAllEqual(v2.numpy(), want, msg=type(opt).__name__)

  def testAdafactorFactoredMatchesNumpy(self):
    rng = np.random.RandomState(0)
    w0 = rng.randn(4, 6).astype(np.float32)
    grads = [rng.randn(4, 6).astype(np.float32) for _ in range(4)]
    opt = optimizers.Adafactor.Params().Set(
        min_dim_size_to_factor=2).Instantiate()
    got = self._Run(opt, w0, grads, 0.05)
    self.assertEqual(sorted(opt.slots['Variable']), ['m', 'vc', 'vr'])
    self.assertAllClose(got, _NumpyAdafactor(w0, grads, 0.05), rtol=1e-4,
                        atol=1e-6)

  def testAdafactorUnfactoredAndClipping(self):
    rng = np.random.RandomState(1)
    w0 = rng.randn(5).astype(np.float32)
    # A tiny gradient, then a huge one: at step 2 the second moment is still
    # mostly the tiny one (beta2 = 1 - 2^-0.8 = 0.43), so the update
    # u = g / sqrt(v) has RMS about 1 / sqrt(1 - beta2) = 1.3 > 1: clipped.
    grads = [(rng.randn(5) * scale).astype(np.float32)
             for scale in (1e-3, 1e3, 1.0)]
    g1, g2 = grads[0].astype(np.float64), grads[1].astype(np.float64)
    beta2 = 1.0 - 2.0 ** -0.8
    v2 = beta2 * (g1 * g1 + 1e-30) + (1 - beta2) * (g2 * g2 + 1e-30)
    self.assertGreater(np.sqrt(np.mean(g2 * g2 / v2)), 1.2)
    for beta1 in (0.0, 0.9):
      with self.subTest(beta1=beta1):
        opt = optimizers.Adafactor.Params().Set(beta1=beta1).Instantiate()
        got = self._Run(opt, w0, grads, 0.1)
        self.assertEqual(sorted(opt.slots['Variable']),
                         ['m', 'v'] if beta1 else ['v'])
        want = _NumpyAdafactor(w0, grads, 0.1, beta1=beta1, factored=False)
        self.assertAllClose(got, want, rtol=1e-4, atol=1e-6)
        # Without the clipping the weights would be far off.
        unclipped = _NumpyAdafactor(w0, grads, 0.1, beta1=beta1,
                                    factored=False, clip=np.inf)
        self.assertGreater(np.abs(unclipped - want).max(), 1e-3)
    # Factored second moments only for both dims >= min_dim_size_to_factor.
    big = optimizers.Adafactor.Params().Instantiate()
    big.Build({'w': tf.Variable(tf.zeros([128, 130]))})
    self.assertIn('vr', big.slots['w'])
    self.assertEqual(big.slots['w']['vr'].shape, [128])

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'decay_exponent=0.5'):
      optimizers.Adafactor.Params().Set(decay_exponent=0.5).Instantiate()
    with self.assertRaisesRegex(ValueError, 'beta2=1.0 must be in'):
      optimizers.Adam.Params().Set(beta2=1.0).Instantiate()
    with self.assertRaisesRegex(ValueError, 'momentum=-0.1 must be in'):
      optimizers.SGD.Params().Set(momentum=-0.1).Instantiate()
    opt = optimizers.SGD.Params().Instantiate()
    with self.assertRaisesRegex(ValueError, 'no gradient'):
      opt.Apply(0.1, [None], [tf.Variable(1.0)])
    with self.assertRaisesRegex(ValueError, "two variables are named 'w'.*"
                                'VariablesByPath'):
      opt.Build([tf.Variable(1.0, name='w'), tf.Variable(2.0, name='w')])

  def testVariableMissingOrNewNamesThePath(self):
    a, b = tf.Variable(1.0, name='w'), tf.Variable(2.0, name='w')
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build({'model/fc0/w': a, 'model/fc1/w': b})
    with self.assertRaisesRegex(ValueError, "no variable for paths "
                                "'model/fc1/w', which it was built for"):
      opt.Apply(0.1, [1.0], [a])
    c = tf.Variable([3.0], name='extra')
    with self.assertRaisesRegex(ValueError, r"variable 'extra:0' \(1,\) is "
                                'not one that Adam was built for'):
      opt.Apply(0.1, [1.0, 1.0, [1.0]], [a, b, c])
    with self.assertRaisesRegex(ValueError, "new paths 'model/fc2/w'; paths "
                                "gone 'model/fc1/w'"):
      opt.Build({'model/fc0/w': a, 'model/fc2/w': b})
    with self.assertRaisesRegex(ValueError, "other variable objects at paths "
                                "'model/fc1/w'"):
      opt.Build({'model/fc0/w': a, 'model/fc1/w': tf.Variable(2.0)})
    opt.Build({'model/fc1/w': b, 'model/fc0/w': a})  # Same: no-op.
    self.assertEqual(opt.Paths(), ['model/fc0/w', 'model/fc1/w'])


if __name__ == '__main__':
  tf.test.main()
