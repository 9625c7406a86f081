"""The cut of a GPT-2-small-sized keras_hub causal LM at K=4 (slow).

`GPT2CausalLM` with 12 blocks, d=768, a 50257-piece vocabulary and
sequences of 1024, as given (preprocessor=None): the cost model counts the
unknown sequence axis at the backbone's max_sequence_length, so the plan
(`keras_graph_params.GraphPlan`, which costs and cuts without building the
pipeline's weights; only the Keras model's own ~124M weights are made,
once) balances the blocks. Per example a block is ~17.3 GFLOPs (24 d^2 per
token plus attention over 1024 positions) and the tied softmax ~77 GFLOPs
(2 d V per token), 27% of the model: the balanced cut gives the first three
devices four blocks each and the last device the final norm and the
softmax, within 15% of each other.
"""

import keras_hub
import tensorflow as tf

from tensorpipe import keras_graph_params
from tensorpipe import keras_nested

_K, _SEQ = 4, 1024


def _Plan():
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
      intermediate_dim=3072, max_sequence_length=_SEQ, dropout=0.0)
  lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  flat = keras_nested.NestedSource(lm)
  return keras_graph_params.GraphPlan(
      flat.model, _K, num_micro_batches=8, batch_size=8,
      sequence_length=keras_nested.MaxSequenceLength(lm))


class Gpt2SmallCutTest(tf.test.TestCase):

  def testBlocksAreBalancedAndEveryCutIsReported(self):
    built = _Plan()
    plan, graph = built.plan, built.graph
    flops = plan.flops
    self.assertLen(flops, _K)
    self.assertLessEqual((max(flops) - min(flops)) / max(flops), 0.15)
    names = [[(graph.nodes[i].layer, graph.nodes[i].index)
              for i in plan.Nodes(graph, k)] for k in range(_K)]
    blocks = [[n for n, _ in stage if n.startswith('transformer_layer')]
              for stage in names]
    # The input embeddings never make a stage of their own: the first
    # stage holds them and four blocks; the blocks are spread 4 / 4 / 4.
    self.assertEqual([len(b) for b in blocks], [4, 4, 4, 0])
    self.assertIn(('token_embedding', 0), names[0])
    # The last stage is the tied softmax (the table's second call), 27% of
    # the FLOPs: more than a quarter, so adding a block to it would break
    # the 15% bound.
    self.assertEqual(names[3], [('token_embedding', 1)])
    self.assertIn('tied: token_embedding (38597376 weights) is held on the '
                  'devices of segments 0, 3', built.Report())
    report = built.Report()
    for k in range(_K - 1):
      self.assertRegex(report, rf'cut {k}: \d+ tensor\(s\), \d+ bytes')
      self.assertNotEmpty(plan.boundaries[k])
    # A cut after a block carries [batch, 1024, 768] float32 activations.
    self.assertIn(f'{8 * _SEQ * 768 * 4} bytes', report)


if __name__ == '__main__':
  tf.test.main()
