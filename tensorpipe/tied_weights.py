"""Weights read by more than one pipeline stage (tied embeddings).

A language model often reads its token embedding table twice: to embed the
input ids (the first stage) and, transposed, to project the last hidden
state to logits (the last stage). GPT-2 and Gemma tie the two: one
variable. Megatron-LM keeps a copy of the table on the first and the last
stage and adds their gradients after the backward pass (its "embedding
group", an all-reduce between the two); DeepSpeed's `TiedLayerSpec` does
the same. Here, in one process:

  * the variable lives once, in the layer that creates it (its *owner*);
    checkpoints, `VariablesByPath`, get_weights and exports see it once;
  * a layer that reads it declares so (`BaseLayer.TiedWeights`: its theta
    key -> the variable's path below the pipeline) and creates nothing;
  * each call, every stage that reads it gets it as one more theta entry,
    copied to its device with the other thetas (`Place`); every schedule
    then accumulates each stage's gradient for it over micro-batches like
    any other weight's;
  * the per-stage totals are added once per step, in stage order with the
    owner's first, on the owner's device (`SumInOrder`): by the gradient of
    the copies (`Share`) when a tape differentiates the step, by `Fold` for
    the gradients a loss-inside step returns. So the reader's gradient
    crosses devices once per step, and the sum does not depend on TF's
    order of aggregating gradients.

  ties = Resolve(container, stage_layers)   # per variable: owner, readers
  thetas = Place(ties, stage_thetas, copies, devices)   # in PipelineCall.Make
  ...                                       # any schedule: dthetas per stage
  grads = Fold(ties, grads, devices)        # FPropLossAndGrads

`Inject` gives the readers the owner's value without copies, for the
unpipelined paths (`LayersWithTheta`, SequentialLayer), whose tape sums
the two reads itself.

A path into a stage's theta (`Use.path`) is the layer's index in its stage,
then the keys (and list indices) down to the entry, e.g.
(3, 'sub', 1, 'embeddings').
"""

import dataclasses
import difflib
from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import grad_sum


@dataclasses.dataclass(frozen=True)
class Use:
  """Where one stage holds or reads a tied variable."""
  stage: int
  path: Tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Tie:
  """One variable read by more than its own layer.

  Attributes:
    variable: its path below the container, e.g. 'emb/tgt_emb/emb'.
    owner: where it lives (the stage of the layer that creates it).
    readers: where other layers read it, in stage order.
  """
  variable: str
  owner: Use
  readers: Tuple[Use, ...]

  @property
  def stages(self) -> List[int]:
    """The stages holding it: the owner's, then the readers'."""
    return [self.owner.stage] + [r.stage for r in self.readers]


def _Walk(layer: base_layer.BaseLayer, path: Tuple[Any, ...],
          out: List[Tuple[base_layer.BaseLayer, Tuple[Any, ...]]]) -> None:
  """(layer, its theta path) of `layer` and every descendant."""
  out.append((layer, path))
  for name, child in layer.children.items():
    if isinstance(child, (list, tuple)):
      for j, c in enumerate(child):
        _Walk(c, path + (name, j), out)
    else:
      _Walk(child, path + (name,), out)


def _Relative(container: base_layer.BaseLayer, path: str) -> str:
  prefix = container.path
  if prefix and path.startswith(prefix + '/'):
    return path[len(prefix) + 1:]
  return path


def Resolve(container: base_layer.BaseLayer,
            stage_layers: Sequence[Sequence[base_layer.BaseLayer]]
            ) -> Tuple[Tie, ...]:
  """The tied variables of `container`'s stages (lists of layers).

  Raises:
    ValueError: a layer ties a key to a path that is no variable below the
      container, or to a key it also has itself.
  """
  walked = []
  for s, layers in enumerate(stage_layers):
    for i, top in enumerate(layers):
      found = []
      _Walk(top, (i,), found)
      walked.extend((s, layer, path) for layer, path in found)
  owners: Dict[str, Use] = {}
  for s, layer, path in walked:
    for key in layer.vars:
      rel = _Relative(container, base_layer.VariablePath(layer, key))
      owners[rel] = Use(s, path + (key,))
  readers: Dict[str, List[Use]] = {}
  for s, layer, path in walked:
    for key, target in layer.TiedWeights().items():
      who = f'{type(layer).__name__} {layer.path or layer.layer_name!r}'
      if target not in owners:
        near = difflib.get_close_matches(target, list(owners), n=1)
        hint = f'; did you mean {near[0]!r}?' if near else ''
        raise ValueError(
            f'{who} reads the weight {target!r} of another layer (theta key '
            f'{key!r}), but {type(container).__name__} '
            f'{container.layer_name!r} has no variable of that path{hint} '
            '(paths are relative to the pipeline, e.g. '
            "'emb/tgt_emb/emb'); put the layer that owns it in the same "
            'pipeline or fix the path')
      if key in layer.vars or key in layer.children:
        raise ValueError(f'{who} has its own {key!r} and also reads '
                         f'{target!r} under that key; drop one')
      readers.setdefault(target, []).append(Use(s, path + (key,)))
  return tuple(
      Tie(v, owners[v], tuple(sorted(rs, key=lambda u: (u.stage, u.path))))
      for v, rs in sorted(readers.items(),
                          key=lambda kv: (owners[kv[0]].stage, kv[0])))


def _Get(struct: Any, path: Sequence[Any]) -> Any:
  for key in path:
    struct = struct[key]
  return struct


def _Set(struct: Any, path: Sequence[Any], value: Any) -> None:
  _Get(struct, path[:-1])[path[-1]] = value


def _Copy(thetas: Sequence[Any]) -> List[Any]:
  """New containers over the same leaves, one per stage."""
  return [tf.nest.map_structure(lambda x: x, list(t)) for t in thetas]


def Inject(ties: Sequence[Tie], thetas: Sequence[Any]) -> List[Any]:
  """Per stage its theta with the readers' entries set to the owner's value
  (no copies: a tape over one device sums the reads itself)."""
  if not ties:
    return list(thetas)
  out = _Copy(thetas)
  for tie in ties:
    value = _Get(out[tie.owner.stage], tie.owner.path)
    for r in tie.readers:
      _Set(out[r.stage], r.path, value)
  return out


def SumInOrder(terms: Sequence[Any], device: str) -> tf.Tensor:
  """((terms[0] + terms[1]) + ...) on `device`; None terms are skipped.

  Each term and each partial sum is kept apart (`grad_sum.Apart`): a
  stage's total is its last running sum's AddN, and in one graph
  Grappler merged the two into one AddN of another order, so the same
  stages gave another table gradient across processes (the sums outside
  the cells) than in one process (tied_weights_test)."""
  terms = [t for t in terms if t is not None]
  with tf.device(device):
    total = grad_sum.Apart(terms[0])
    for t in terms[1:]:
      total = grad_sum.Apart(total + grad_sum.Apart(t))
  return total


def Share(value: Any, devices: Sequence[str]) -> List[tf.Tensor]:
  """One copy of `value` per device; their gradients are summed in the
  devices' order on the first (`SumInOrder`), whatever order TF's autodiff
  would aggregate them in."""
  with tf.device(devices[0]):
    x = tf.identity(value)

  @tf.custom_gradient
  def Copies(v):
    outs = []
    for d in devices:
      with tf.device(d):
        outs.append(tf.identity(v))

    def Grad(*dys):
      if all(dy is None for dy in dys):
        return tf.zeros_like(v)
      return SumInOrder(dys, devices[0])
    return outs, Grad
  return list(Copies(x))


def Place(ties: Sequence[Tie], stage_thetas: Sequence[Any],
          copies: Sequence[Any], devices: Sequence[str]) -> List[Any]:
  """`copies` (per stage its theta copied to its device) with each tied
  variable's owner and reader entries made by one `Share` of the owner's
  value in `stage_thetas`.

  Args:
    ties: `Resolve`'s result.
    stage_thetas: per stage its theta as given (readers' entries absent).
    copies: the same copied to each stage's device.
    devices: per stage its device.
  """
  out = _Copy(copies)
  for tie in ties:
    shared = Share(_Get(stage_thetas[tie.owner.stage], tie.owner.path),
                   [devices[s] for s in tie.stages])
    for use, copy in zip((tie.owner,) + tie.readers, shared):
      _Set(out[use.stage], use.path, copy)
  return out


def Fold(ties: Sequence[Tie], grads: Sequence[Any],
         devices: Sequence[str]) -> List[Any]:
  """Per stage its gradients in its theta's structure, with each reader's
  entry removed and added to the owner's (`SumInOrder`)."""
  if not ties:
    return list(grads)
  out = _Copy(grads)
  for tie in ties:
    uses = (tie.owner,) + tie.readers
    total = SumInOrder([_Get(out[u.stage], u.path) for u in uses],
                       devices[tie.owner.stage])
    _Set(out[tie.owner.stage], tie.owner.path, total)
    for r in tie.readers:
      del _Get(out[r.stage], r.path[:-1])[r.path[-1]]
  return out
