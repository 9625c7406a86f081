"""Tests for tensorpipe.flops (FLOPs counted from a traced graph)."""

import tensorflow as tf

from tensorpipe import flops


def _Graph(fn, *specs):
  return tf.function(fn, autograph=False).get_concrete_function(*specs).graph


class CountFlopsTest(tf.test.TestCase):

  def testMatmulConvEinsumFollowTheFormulas(self):
    def Fn(a, b, img, w):
      return (tf.matmul(a, b, transpose_a=True),
              tf.nn.conv2d(img, w, 1, 'VALID'),
              tf.einsum('bij,jk->bik', img[:, 0], b[:3]))
    graph = _Graph(Fn, tf.TensorSpec([7, 2]), tf.TensorSpec([7, 5]),
                   tf.TensorSpec([2, 6, 6, 3]), tf.TensorSpec([3, 3, 3, 4]))
    expected = (2 * 2 * 7 * 5              # matmul [2, 7] x [7, 5]
                + 2 * (2 * 4 * 4 * 4) * 27  # conv: 2 x output x taps x in
                + 2 * 2 * 6 * 3 * 5)       # einsum: 2 x b i j k
    self.assertEqual(flops.CountFlops(graph), expected)

  def testDepthwisePoolingElementwiseAndFreeOps(self):
    def Fn(img, w):
      y = tf.nn.depthwise_conv2d(img, w, [1, 1, 1, 1], 'SAME')  # [2,4,4,6]
      y = tf.nn.max_pool2d(y, 2, 2, 'VALID')                    # [2,2,2,6]
      y = tf.tanh(tf.reshape(y, [2, -1]))                        # 24 tanh
      return tf.reduce_sum(tf.transpose(y))                      # 48 adds
    graph = _Graph(Fn, tf.TensorSpec([2, 4, 4, 3]),
                   tf.TensorSpec([3, 3, 3, 2]))
    expected = (2 * (2 * 4 * 4 * 6) * 9   # depthwise: 2 x output x taps
                + (2 * 2 * 2 * 6) * 4     # max pool: output x window
                + 4 * 48                  # tanh: 4 per element
                + 48)                     # sum over the input
    self.assertEqual(flops.CountFlops(graph), expected)


if __name__ == '__main__':
  tf.test.main()
